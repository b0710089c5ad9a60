package web

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// keepAlive is how often an idle event stream gets a comment line.
const keepAlive = 15 * time.Second

// Handler serves a Builder's View live: "/" the page with the View as it
// is now, "/view.json" the View, "/events?from=N" the updates after
// version N as server-sent events (one JSON Update per event; a "reload"
// event when they are no longer kept), and, with an AnatomyControl, POST
// "/anatomy?action=start|stop|show" the daemons' recorders of hop stamps,
// which it stops when no page has had its event stream open for a while.
func Handler(b *Builder) http.Handler { return handler(b, nil, pageGrace) }

// handler is Handler whose event streams end when done is closed, and
// whose recorders stop grace after the last page left.
func handler(b *Builder, done <-chan struct{}, grace time.Duration) http.Handler {
	mux := http.NewServeMux()
	open := &pages{b: b, grace: grace}
	mux.HandleFunc("POST /anatomy", func(w http.ResponseWriter, r *http.Request) { serveAnatomy(b, open, w, r) })
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		if err := b.WriteHTML(&buf); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(buf.Bytes())
	})
	mux.HandleFunc("GET /view.json", func(w http.ResponseWriter, r *http.Request) {
		data, err := b.JSON()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(data)
	})
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
		from, err := strconv.Atoi(r.URL.Query().Get("from"))
		if err != nil || from < 0 {
			http.Error(w, "events: from must be a version (a number ≥ 0)", http.StatusBadRequest)
			return
		}
		open.open()
		defer open.close()
		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		tick := time.NewTicker(keepAlive)
		defer tick.Stop()
		for {
			lines, changed, ok := b.Updates(from)
			if !ok {
				// The page is too far behind: it loads itself again.
				fmt.Fprint(w, "event: reload\ndata: \n\n")
				rc.Flush()
				return
			}
			for _, l := range lines {
				if _, err := fmt.Fprintf(w, "data: %s\n\n", l); err != nil {
					return
				}
			}
			from += len(lines)
			if err := rc.Flush(); err != nil {
				return
			}
			select {
			case <-r.Context().Done():
				return
			case <-done:
				return
			case <-changed:
			case <-tick.C:
				if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
					return
				}
			}
		}
	})
	return mux
}

// Server serves a Builder's View over HTTP (see Handler).
type Server struct {
	ln   net.Listener
	srv  *http.Server
	err  chan error
	done chan struct{}
	once sync.Once
	cerr error
}

// Serve listens on addr ("127.0.0.1:7180"; port 0 picks one) and serves
// b's View until Close. b should be live (Builder.SetLive).
func Serve(addr string, b *Builder) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, err: make(chan error, 1), done: make(chan struct{})}
	s.srv = &http.Server{Handler: handler(b, s.done, pageGrace), ReadHeaderTimeout: 10 * time.Second}
	go func() { s.err <- s.srv.Serve(ln) }()
	return s, nil
}

// URL is the page's address.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() + "/" }

// Close ends every event stream (cleanly: the pages see the stream end)
// and stops the server.
func (s *Server) Close() error {
	s.once.Do(func() {
		close(s.done)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			s.cerr = s.srv.Close()
		}
		<-s.err
	})
	return s.cerr
}
