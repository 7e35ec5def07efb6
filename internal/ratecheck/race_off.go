//go:build !race

package ratecheck

// raceDetector says the tests run with the race detector, whose
// instrumentation multiplies the CPU a process spends.
const raceDetector = false
