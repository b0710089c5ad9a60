package main

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// taskNices returns the nice value of every thread of the process (field
// 19 of /proc/self/task/<tid>/stat).
func taskNices(t *testing.T) map[int]int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skip(err)
	}
	out := map[int]int{}
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/stat")
		if err != nil {
			continue // gone
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		n, _ := strconv.Atoi(f[16])
		tid, _ := strconv.Atoi(e.Name())
		out[tid] = n
	}
	return out
}

// lockedThreads starts n goroutines, each on an OS thread of its own,
// and returns a func that lets them end.
func lockedThreads(n int) func() {
	var started, done sync.WaitGroup
	stop := make(chan struct{})
	for range n {
		started.Add(1)
		done.Add(1)
		go func() {
			runtime.LockOSThread()
			started.Done()
			<-stop
			done.Done() // the thread exits with the locked goroutine
		}()
	}
	started.Wait()
	return func() { close(stop); done.Wait() }
}

// TestReniceThreads: every thread gets the value, and threads started
// afterwards inherit it. It lowers the priority by one (no privilege
// needed to go that way).
func TestReniceThreads(t *testing.T) {
	end := lockedThreads(3)
	defer end()
	cur, err := threadNice()
	if err != nil {
		t.Fatal(err)
	}
	want := min(cur+1, 19)
	if err := reniceThreads(want); err != nil {
		t.Fatal(err)
	}
	for tid, n := range taskNices(t) {
		if n != want {
			t.Errorf("thread %d: nice %d, want %d", tid, n, want)
		}
	}
	if got, _ := threadNice(); got != want {
		t.Errorf("threadNice = %d, want %d", got, want)
	}
	end2 := lockedThreads(3)
	defer end2()
	for tid, n := range taskNices(t) {
		if n != want {
			t.Errorf("thread %d started later: nice %d, want %d", tid, n, want)
		}
	}
}
