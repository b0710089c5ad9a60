package syncbuf

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWrites writes lines from several goroutines while another
// reads, then checks that every line arrived whole, once, and in its
// writer's order, and that every read saw a prefix of the final content.
func TestConcurrentWrites(t *testing.T) {
	const writers, lines = 4, 500
	var b Buffer
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				fmt.Fprintf(&b, "writer %d line %03d\n", w, i)
			}
		})
	}
	// The reader checks that each read extends the one before it and ends
	// at a line boundary (a Write is never split).
	done := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		prev := ""
		for {
			s, p := b.String(), string(b.Bytes())
			if !strings.HasPrefix(p, s) {
				readErr <- fmt.Errorf("Bytes returned %d bytes that do not extend String's %d", len(p), len(s))
				return
			}
			if !strings.HasPrefix(s, prev) {
				readErr <- fmt.Errorf("a read of %d bytes does not extend the previous one of %d", len(s), len(prev))
				return
			}
			if s != "" && !strings.HasSuffix(s, "\n") || p != "" && !strings.HasSuffix(p, "\n") {
				readErr <- fmt.Errorf("a read ended inside a Write: %q", s[max(0, len(s)-30):])
				return
			}
			prev = p
			select {
			case <-done:
				if !strings.HasPrefix(b.String(), prev) {
					readErr <- errors.New("the final content does not extend the last read")
					return
				}
				readErr <- nil
				return
			default:
			}
		}
	}()
	wg.Wait()
	close(done)
	if err := <-readErr; err != nil {
		t.Fatal(err)
	}

	got := b.String()
	if string(b.Bytes()) != got {
		t.Fatalf("Bytes and String differ:\n%q\n%q", b.Bytes(), got)
	}
	var want []string
	for w := range writers {
		for i := range lines {
			want = append(want, fmt.Sprintf("writer %d line %03d", w, i))
		}
	}
	all := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	sorted := slices.Sorted(slices.Values(all))
	if !slices.Equal(sorted, want) {
		t.Fatalf("got %d lines, want %d; sorted content differs from the lines written", len(all), len(want))
	}
	next := make([]int, writers) // next line number expected from each writer
	for _, l := range all {
		var w, i int
		if _, err := fmt.Sscanf(l, "writer %d line %d", &w, &i); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if i != next[w] {
			t.Fatalf("writer %d: line %d after line %d", w, i, next[w]-1)
		}
		next[w]++
	}
}

// TestBytesCopy checks that Bytes returns a copy: changing it, or writing
// more, leaves the other unchanged.
func TestBytesCopy(t *testing.T) {
	var b Buffer
	b.Write([]byte("abc"))
	p := b.Bytes()
	p[0] = 'X'
	b.Write([]byte("def"))
	if got := b.String(); got != "abcdef" {
		t.Errorf("buffer = %q after changing a copy, want %q", got, "abcdef")
	}
	if !bytes.Equal(p, []byte("Xbc")) {
		t.Errorf("copy = %q after a later Write, want %q", p, "Xbc")
	}
	var empty Buffer
	if got := empty.Bytes(); len(got) != 0 {
		t.Errorf("zero Buffer's Bytes = %q, want empty", got)
	}
}
