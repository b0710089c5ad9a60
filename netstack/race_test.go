//go:build race

package netstack

// raceEnabled reports a -race build, in which sync.Pool drops a quarter of
// what is put into it, so pooled objects (gVisor's) are allocated again.
const raceEnabled = true
