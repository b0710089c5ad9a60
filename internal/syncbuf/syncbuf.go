// Package syncbuf provides a byte buffer that one goroutine can write
// while others read it, such as a child process's stdout or stderr that a
// caller inspects before the process exits.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer guarded by a mutex: Write, Bytes and String may
// be called from several goroutines at once. The zero value is an empty
// buffer ready to use. A Buffer must not be copied after first use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer. Each call's bytes stay together: another
// goroutine's Write never lands in the middle of them.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// Bytes returns a copy of what has been written so far; later writes do not
// change it.
func (s *Buffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// String returns what has been written so far as a string.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
