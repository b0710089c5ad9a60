//go:build !race

package web

// raceEnabled says the tests run under the race detector.
const raceEnabled = false
