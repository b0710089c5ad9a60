package perftest

import (
	"context"
	"io"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

// TestSizeMismatch: a client with a larger -s than the server's fails,
// and both sides say it is the size, for Write, Read and Send bandwidth,
// rather than only 'remote access error (posted 100, completed 8)' on the
// client and 'the peer closed the control connection' on the server,
// neither of which names the cause.
func TestSizeMismatch(t *testing.T) {
	for i, verb := range []Verb{Write, Read, Send} {
		t.Run(verb.String(), func(t *testing.T) {
			cdev, sdev := devicePair(t, 1500)
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			port := uint16(19100 + i)
			var cerr, serr error
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, serr = RunServer(ctx, sdev, port, Config{Verb: verb, Size: 4096, Iters: 100}, io.Discard)
			}()
			go func() {
				defer wg.Done()
				_, cerr = RunClient(ctx, cdev, netip.AddrPortFrom(srvPrefix.Addr(), port),
					Config{Verb: verb, Size: 65536, Iters: 100, ConnectRetries: 100}, io.Discard)
			}()
			wg.Wait()
			t.Logf("client: %v\nserver: %v", cerr, serr)
			if cerr == nil || !strings.Contains(cerr.Error(), "the server's buffer is smaller than this client's messages (-s 65536;") ||
				!strings.Contains(cerr.Error(), "run server and client with the same -s") {
				t.Errorf("client: %v", cerr)
			}
			if serr == nil || !strings.Contains(serr.Error(), "the client's messages are larger than this server's buffer (-s 4096;") {
				t.Errorf("server: %v", serr)
			}
		})
	}
}
