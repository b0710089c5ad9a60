package ctl

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fakeProvider answers with the golden fixtures.
type fakeProvider struct{ panicOn string }

func (f fakeProvider) DevInfo() DevInfo {
	if f.panicOn == OpDevInfo {
		panic("provider bug")
	}
	return fixtureDevInfo()
}
func (fakeProvider) Link() Link   { return fixtureLinks()[0] }
func (fakeProvider) QPs() []QP    { return fixtureQPs() }
func (fakeProvider) Stats() Stats { return fixtureStats() }

// startServer serves p on a socket in a fresh directory; configure, if
// given, runs before Serve.
func startServer(t *testing.T, p Provider, configure ...func(*Server)) *Server {
	t.Helper()
	s, err := Listen(SocketPath(t.TempDir(), "siwtun0"), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range configure {
		f(s)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

func dial(t *testing.T, path string) *Client {
	t.Helper()
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestServerOps(t *testing.T) {
	s := startServer(t, fakeProvider{})
	c := dial(t, s.Path())
	if c.Dev() != "siwtun0" {
		t.Errorf("Dev = %q", c.Dev())
	}
	d, err := c.DevInfo()
	if err != nil || !reflect.DeepEqual(d, fixtureDevInfo()) {
		t.Errorf("DevInfo = %+v, %v", d, err)
	}
	l, err := c.Link()
	if err != nil || !reflect.DeepEqual(l, fixtureLinks()[0]) {
		t.Errorf("Link = %+v, %v", l, err)
	}
	qps, err := c.QPs(0)
	if err != nil || !reflect.DeepEqual(qps, fixtureQPs()) {
		t.Errorf("QPs(0) = %+v, %v", qps, err)
	}
	qps, err = c.QPs(2)
	if err != nil || len(qps) != 1 || qps[0].LQPN != 2 {
		t.Errorf("QPs(2) = %+v, %v", qps, err)
	}
	if _, err := c.QPs(9); err == nil || err.Error() != "siwtun0: no queue pair 9" {
		t.Errorf("QPs(9) error = %v", err)
	}
	if _, err := c.QPs(-1); err == nil {
		t.Errorf("QPs(-1) succeeded")
	}
	st, err := c.Stats()
	if err != nil || !reflect.DeepEqual(st, fixtureStats()) {
		t.Errorf("Stats = %+v, %v", st, err)
	}
}

// rawConn is a hostile client speaking the protocol by hand.
type rawConn struct {
	t  *testing.T
	c  *net.UnixConn
	br *bufio.Reader
}

func dialRaw(t *testing.T, path string) *rawConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) send(s string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, s); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

func (r *rawConn) recv() Response {
	r.t.Helper()
	line, err := r.br.ReadBytes('\n')
	if err != nil {
		r.t.Fatalf("read response: %v", err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		r.t.Fatalf("response %q: %v", line, err)
	}
	return resp
}

// wantError checks for an error response containing substr.
func (r *rawConn) wantError(substr string) {
	r.t.Helper()
	resp := r.recv()
	if resp.OK || !strings.Contains(resp.Error, substr) {
		r.t.Errorf("response %+v, want an error containing %q", resp, substr)
	}
}

// wantLink checks that the connection still serves a valid request.
func (r *rawConn) wantLink() {
	r.t.Helper()
	r.send(`{"op":"link"}` + "\n")
	if resp := r.recv(); !resp.OK || resp.Link == nil || resp.Link.Link != "siwtun0/1" {
		r.t.Errorf("link after a bad request: %+v", resp)
	}
}

func TestServerHostileRequests(t *testing.T) {
	s := startServer(t, fakeProvider{})
	r := dialRaw(t, s.Path())
	tests := []struct {
		name, line, err string
	}{
		{"truncated JSON", `{"op":"devinfo"`, "malformed request"},
		{"not JSON", `hello`, "malformed request"},
		{"JSON array", `[1,2]`, "malformed request"},
		{"unknown op", `{"op":"reboot"}`, `unknown op "reboot"`},
		{"missing op", `{}`, `missing "op"`},
		{"unknown field", `{"op":"qp","lqpn":1}`, `unknown field "lqpn"`},
		{"negative qp", `{"op":"qp","qp":-1}`, "malformed request"},
		{"qp with link", `{"op":"link","qp":1}`, "only valid with op"},
		{"two objects", `{"op":"link"} {"op":"link"}`, "data after the JSON object"},
		{"missing qp", `{"op":"qp","qp":77}`, "no queue pair 77"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.t = t
			r.send(tt.line + "\n")
			r.wantError(tt.err)
			r.wantLink()
		})
	}
	r.t = t

	t.Run("1 MiB garbage line", func(t *testing.T) {
		r.t = t
		garbage := strings.Repeat("\x00garbage\xff", 1<<20/10)
		go func() {
			// The server answers after the first 4 KiB and keeps reading;
			// write in the background so neither side waits for the other.
			io.WriteString(r.c, garbage+"\n")
		}()
		r.wantError("request longer than 4096 bytes")
		r.wantLink()
	})
	r.t = t

	t.Run("blank lines are ignored", func(t *testing.T) {
		r.t = t
		r.send("\n \n")
		r.wantLink()
	})
	r.t = t

	t.Run("last request without newline", func(t *testing.T) {
		h := dialRaw(t, s.Path())
		h.send(`{"op":"dev`)
		h.c.CloseWrite()
		h.wantError("malformed request")
		if _, err := h.br.ReadByte(); err != io.EOF {
			t.Errorf("after the last request: %v, want EOF", err)
		}
	})

	// The server still serves new clients.
	if _, err := dial(t, s.Path()).DevInfo(); err != nil {
		t.Fatal(err)
	}
}

func TestServerSlowloris(t *testing.T) {
	s := startServer(t, fakeProvider{}, func(s *Server) { s.ReadTimeout = 300 * time.Millisecond })
	idle := dialRaw(t, s.Path())
	partial := dialRaw(t, s.Path())
	partial.send(`{"op":"de`)

	// Served at once while the slow clients hold their connections.
	start := time.Now()
	if _, err := dial(t, s.Path()).Stats(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("a good client waited %v behind slow ones", d)
	}
	for _, r := range []*rawConn{idle, partial} {
		r.wantError("no complete request within 300ms")
		if _, err := r.br.ReadByte(); err != io.EOF {
			t.Errorf("slow connection not closed: %v", err)
		}
	}
	if _, err := dial(t, s.Path()).Link(); err != nil {
		t.Fatal(err)
	}
}

func TestServerMaxConns(t *testing.T) {
	s := startServer(t, fakeProvider{})
	conns := make([]*rawConn, 0, MaxConns)
	for range MaxConns {
		r := dialRaw(t, s.Path())
		r.wantLink() // registered and served
		conns = append(conns, r)
	}
	over := dialRaw(t, s.Path())
	over.wantError("too many control connections")
	for _, r := range conns {
		r.c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := Dial(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Link()
		c.Close()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection slot freed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServerProviderPanic(t *testing.T) {
	s := startServer(t, fakeProvider{panicOn: OpDevInfo})
	c := dial(t, s.Path())
	if _, err := c.DevInfo(); err == nil || !strings.Contains(err.Error(), "internal error: provider bug") {
		t.Errorf("DevInfo error = %v", err)
	}
	if _, err := c.Link(); err != nil {
		t.Errorf("after a provider panic: %v", err)
	}
}

func TestListenSocketFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "siwtun")
	path := SocketPath(dir, "siwtun0")
	s, err := Listen(path, fakeProvider{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != SocketMode {
		t.Errorf("socket mode %v, want socket %o", fi.Mode(), SocketMode)
	}
	di, err := os.Stat(dir)
	if err != nil || di.Mode().Perm() != DirMode {
		t.Errorf("directory mode %v (%v), want %o", di.Mode(), err, DirMode)
	}

	// A second daemon must not take over a live socket.
	if _, err := Listen(path, fakeProvider{}, nil); err == nil || !strings.Contains(err.Error(), "another siwtun daemon") {
		t.Errorf("second Listen: %v", err)
	}
	if _, err := dial(t, path).Link(); err != nil {
		t.Errorf("first server after the second Listen: %v", err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve after Close: %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestListenStaleSocket(t *testing.T) {
	path := SocketPath(t.TempDir(), "siwtun0")
	// A crashed daemon leaves its socket file behind.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := Dial(path); !errors.Is(err, ErrNoDaemon) {
		t.Errorf("Dial of a stale socket: %v, want ErrNoDaemon", err)
	}
	s, err := Listen(path, fakeProvider{}, nil)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	go s.Serve()
	defer s.Close()
	if _, err := dial(t, path).DevInfo(); err != nil {
		t.Error(err)
	}
}

func TestListenNotASocket(t *testing.T) {
	path := SocketPath(t.TempDir(), "siwtun0")
	if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path, fakeProvider{}, nil); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen over a file: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
		t.Errorf("file after Listen: %q, %v", b, err)
	}
}

func TestDialNoDaemon(t *testing.T) {
	_, err := Dial(SocketPath(t.TempDir(), "siwtun7"))
	if !errors.Is(err, ErrNoDaemon) {
		t.Fatalf("Dial: %v, want ErrNoDaemon", err)
	}
	if want := "no siwtun daemon for siwtun7 (is `siwtun up --dev siwtun7` running?)"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}

func TestSocketPath(t *testing.T) {
	if got := SocketPath("", "siwtun0"); got != "/run/siwtun/siwtun0.ctl" {
		t.Errorf("SocketPath = %q", got)
	}
	if got := DevFromPath("/run/siwtun/siwtun3.ctl"); got != "siwtun3" {
		t.Errorf("DevFromPath = %q", got)
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{`{"op":"devinfo"}`, `{"op":"qp","qp":3}`, `{"op":"qp","qp":-1}`, `{`, `[]`, `{"op":"link"} x`, `{"op":"anatomy","anatomy":{"action":"app","app":[[1,2,3,4,5,6]]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseRequest(b)
		if err != nil {
			return
		}
		switch req.Op {
		case OpDevInfo, OpLink, OpStats:
			if req.QP != nil {
				t.Errorf("accepted qp with op %q", req.Op)
			}
		case OpQP:
		case OpAnatomy:
			if req.Anatomy == nil || req.Anatomy.Check() != nil {
				t.Errorf("accepted anatomy request %+v", req.Anatomy)
			}
		default:
			t.Errorf("accepted op %q", req.Op)
		}
	})
}
