package rping

import (
	"bytes"
	"strconv"
)

// The ping data: rping's client writes "rdma-ping-<n>: " and then ASCII
// characters from 'A' to 'z' (65..122), rotating, into its source buffer;
// each ping starts the rotation one character further on. The last byte is
// a NUL, so the data prints as a C string.
const (
	patternFirst = 'A' // 65
	patternLast  = 'z' // 122
	patternSpan  = patternLast - patternFirst + 1
)

// Fill writes ping number ping's data into b (the whole buffer, the ping
// size long; at least MinSize bytes).
func Fill(b []byte, ping int) {
	n := copy(b, "rdma-ping-")
	n += copy(b[n:], strconv.Itoa(ping))
	n += copy(b[n:], ": ")
	c := byte(patternFirst + ping%patternSpan)
	for i := n; i < len(b); i++ {
		b[i] = c
		c++
		if c > patternLast {
			c = patternFirst
		}
	}
	if len(b) > 0 {
		b[len(b)-1] = 0
	}
}

// cString returns b up to its first NUL (all of b without one), what rping
// prints with %s and measures with strlen.
func cString(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}
