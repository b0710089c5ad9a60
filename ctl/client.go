package ctl

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

const (
	// dialTimeout bounds connecting to the control socket.
	dialTimeout = 2 * time.Second
	// callTimeout bounds one request and its response.
	callTimeout = 10 * time.Second
	// maxResponseSize bounds a response line (thousands of queue pairs
	// with their counters fit).
	maxResponseSize = 64 << 20
)

// ErrNoDaemon is returned (wrapped) by Dial when no daemon serves the
// socket: it does not exist, or nothing listens on it.
var ErrNoDaemon = errors.New("no siwtun daemon")

// Client is a connection to a daemon's control socket. Its methods are not
// safe for concurrent use.
type Client struct {
	conn net.Conn
	br   *bufio.Reader
	dev  string
}

// DevFromPath is the device name of a control socket path
// ("/run/siwtun/siwtun0.ctl" → "siwtun0").
func DevFromPath(path string) string {
	return strings.TrimSuffix(filepath.Base(path), SocketSuffix)
}

// Dial connects to the control socket at path. When no daemon serves it
// the error wraps ErrNoDaemon and says how to start one.
func Dial(path string) (*Client, error) {
	dev := DevFromPath(path)
	c, err := net.DialTimeout("unix", path, dialTimeout)
	if err != nil {
		switch {
		case errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.ECONNREFUSED):
			return nil, fmt.Errorf("%w for %s (is `siwtun up --dev %s` running?)", ErrNoDaemon, dev, dev)
		case errors.Is(err, os.ErrPermission):
			return nil, fmt.Errorf("connect to %s: %w (the control socket is mode 0660: run as root or as a member of its group)", path, err)
		}
		return nil, fmt.Errorf("connect to %s: %w", path, err)
	}
	return &Client{conn: c, br: bufio.NewReader(c), dev: dev}, nil
}

// Dev is the device name the client talks to.
func (c *Client) Dev() string { return c.dev }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Call sends one request and returns its successful response; a response
// with ok false is returned as an error.
func (c *Client) Call(req Request) (Response, error) { return c.call(req, callTimeout) }

// call is Call with the time the request and its response may take.
func (c *Client) call(req Request, timeout time.Duration) (Response, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return Response{}, fmt.Errorf("%s: encode request: %w", c.dev, err)
	}
	if err := c.conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return Response{}, fmt.Errorf("%s: %w", c.dev, err)
	}
	if _, err := c.conn.Write(append(b, '\n')); err != nil {
		return Response{}, fmt.Errorf("%s: send request: %w", c.dev, err)
	}
	line, err := readLine(c.br, maxResponseSize)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return Response{}, fmt.Errorf("%s: the daemon closed the control connection", c.dev)
		}
		return Response{}, fmt.Errorf("%s: read response: %w", c.dev, err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return Response{}, fmt.Errorf("%s: malformed response: %w", c.dev, err)
	}
	if !resp.OK {
		if resp.Error == "" {
			resp.Error = "request failed"
		}
		return Response{}, fmt.Errorf("%s: %s", c.dev, resp.Error)
	}
	return resp, nil
}

// readLine reads one newline-terminated line of at most limit bytes.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > limit {
			return nil, fmt.Errorf("response longer than %d bytes", limit)
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
}

// DevInfo returns the device's attributes.
func (c *Client) DevInfo() (DevInfo, error) {
	r, err := c.Call(Request{Op: OpDevInfo})
	if err != nil {
		return DevInfo{}, err
	}
	if r.DevInfo == nil {
		return DevInfo{}, fmt.Errorf("%s: response without devinfo", c.dev)
	}
	return *r.DevInfo, nil
}

// Link returns the device's link.
func (c *Client) Link() (Link, error) {
	r, err := c.Call(Request{Op: OpLink})
	if err != nil {
		return Link{}, err
	}
	if r.Link == nil {
		return Link{}, fmt.Errorf("%s: response without link", c.dev)
	}
	return *r.Link, nil
}

// QPs returns queue pair qp, or every queue pair when qp is 0 (queue pair
// numbers start at 1).
func (c *Client) QPs(qp int) ([]QP, error) {
	req := Request{Op: OpQP}
	if qp < 0 || int64(qp) > int64(^uint32(0)) {
		return nil, fmt.Errorf("%s: queue pair number %d out of range", c.dev, qp)
	}
	if qp > 0 {
		n := uint32(qp)
		req.QP = &n
	}
	r, err := c.Call(req)
	if err != nil {
		return nil, err
	}
	if r.QPs == nil {
		return []QP{}, nil
	}
	return r.QPs, nil
}

// Stats returns the device's counters.
func (c *Client) Stats() (Stats, error) {
	r, err := c.Call(Request{Op: OpStats})
	if err != nil {
		return Stats{}, err
	}
	if r.Stats == nil {
		return Stats{}, fmt.Errorf("%s: response without stats", c.dev)
	}
	return *r.Stats, nil
}
