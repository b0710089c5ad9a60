//go:build !amd64

package crc32c

// update leaves every input to hash/crc32: there is no folding code for
// this architecture.
func update(uint32, []byte) (uint32, bool) { return 0, false }

// copyUpdate leaves every input to copy and hash/crc32.
func copyUpdate(uint32, []byte, []byte, []byte) (uint32, bool) { return 0, false }
