package connperf_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/siwtun/siwtun/apps/connperf"
	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/rnic/rnictest"
)

// testTimeout guards against hangs; it is not a performance bound.
const testTimeout = 60 * time.Second

// TestVerbs: a client opens 20 connections to a server on two in-process
// RNICs, each on a queue pair of its own, reports 20 connect times and a
// rate, and keeps them until it closes them; the server then sees every
// connection go.
func TestVerbs(t *testing.T) {
	const n = 20
	la, lb := netstack.Pipe(1500, netstack.Impairments{})
	cli := rnictest.New(t, la, netip.MustParsePrefix("198.18.0.1/24"), 1500, "siwtun0", nil)
	srv := rnictest.New(t, lb, netip.MustParsePrefix("198.18.0.2/24"), 1500, "siwtun1", nil)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	addr := netip.MustParseAddrPort("198.18.0.2:7400")
	l, err := srv.Device.Listen(addr, n)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *connperf.VerbsConns, 1)
	go func() {
		c, err := connperf.AcceptVerbs(ctx, srv.Device, l, n)
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	c, res, err := connperf.DialVerbs(ctx, cli.Device, addr, n)
	if err != nil {
		t.Fatal(err)
	}
	sc := <-accepted
	if sc == nil {
		t.FailNow()
	}
	defer sc.Close()
	if res.Transport != connperf.TransportVerbs || res.Connections != n || c.Len() != n || sc.Len() != n {
		t.Fatalf("result %+v, %d client and %d server connections; want %d", res, c.Len(), sc.Len(), n)
	}
	if res.MedianUS <= 0 || res.MedianUS > res.P99US || res.P99US > res.MaxUS || res.PerSecond <= 0 || res.End <= res.Start {
		t.Errorf("inconsistent figures %+v", res)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sc.WaitDisconnected(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTCP: the same over the kernel's TCP (loopback).
func TestTCP(t *testing.T) {
	const n = 20
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *connperf.TCPConns, 1)
	go func() {
		c, err := connperf.AcceptTCP(l, n)
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c, res, err := connperf.DialTCP(ctx, l.Addr().String(), n)
	if err != nil {
		t.Fatal(err)
	}
	sc := <-accepted
	if sc == nil {
		t.FailNow()
	}
	defer sc.Close()
	if res.Transport != connperf.TransportTCP || res.Connections != n || c.Len() != n || sc.Len() != n {
		t.Fatalf("result %+v, %d client and %d server connections; want %d", res, c.Len(), sc.Len(), n)
	}
	c.Close()
	if err := sc.WaitClosed(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSpan: the rate of clients together is their connections over the
// span from the earliest start to the latest end.
func TestSpan(t *testing.T) {
	n, rate := connperf.Span([]connperf.Result{
		{Connections: 100, Start: 1e9, End: 2e9},
		{Connections: 300, Start: 1.5e9, End: 3e9},
	})
	if n != 400 || rate != 200 {
		t.Errorf("Span = %d, %v; want 400, 200", n, rate)
	}
}
