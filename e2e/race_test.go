//go:build race

package e2e

// raceEnabled is true when the tests run under the race detector: the
// agents are then built with it too, and a data race in one fails the test
// that ran it.
const raceEnabled = true
