//go:build !race

package commit

// raceDetector says the tests run with the race detector.
const raceDetector = false
