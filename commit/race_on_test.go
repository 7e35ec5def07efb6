//go:build race

package commit

// raceDetector says the tests run with the race detector, whose
// instrumentation multiplies the CPU a process spends.
const raceDetector = true
