// Command hello is a first verbs program: a listener on one RNIC and a
// client on another, each opened through its daemon's verbs socket. The
// listener accepts with its buffer's address and rkey as private data; the
// client finds them in its EventEstablished, RDMA-Writes a greeting into
// that buffer and Sends a note behind it. The note's receive completes
// after the Write is placed (RDMAP keeps order), and the listener prints
// the buffer.
//
//	go run ./examples/hello    # siwtun0 connects to siwtun1 at 198.18.2.2:7471
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/netip"
	"os"
	"time"

	"github.com/siwtun/siwtun/verbs"
)

func main() {
	client := flag.String("client", "siwtun0", "the connecting side's device")
	server := flag.String("server", "siwtun1", "the listening side's device")
	addr := flag.String("addr", "198.18.2.2:7471", "where the listener listens: an address of the -server RNIC")
	flag.Parse()
	if err := run(*client, *server, netip.MustParseAddrPort(*addr), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// end is one side: a device and the objects a connection needs.
type end struct {
	dev *verbs.Device
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	buf []byte // 4 KiB of registered memory
	mr  *verbs.MR
}

// open dials the device's daemon and sets up a QP in INIT, ready for
// receives, with 4 KiB the peer may write into.
func open(name string) (*end, error) {
	e := &end{}
	var err error
	if e.dev, err = verbs.Dial(name); err != nil { // $SIWTUN_SOCKET_DIR/<name>.sock, default /run/siwtun
		return nil, err
	}
	if e.pd, err = e.dev.AllocPD(); err != nil {
		return nil, err
	}
	if e.cq, err = e.dev.CreateCQ(16); err != nil {
		return nil, err
	}
	if e.buf, err = e.dev.AllocBuffer(4096); err != nil { // memory the daemon shares
		return nil, err
	}
	if e.mr, err = e.pd.RegMR(e.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, err
	}
	if e.qp, err = e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, MaxSendWR: 16, MaxRecvWR: 16}); err != nil {
		return nil, err
	}
	return e, e.qp.Modify(verbs.QPInit) // receives may be posted from INIT on
}

// wait returns the next completion, failing on an error status.
func (e *end) wait(ctx context.Context) (verbs.WorkCompletion, error) {
	wc := make([]verbs.WorkCompletion, 1)
	if _, err := e.cq.Wait(ctx, wc); err != nil {
		return wc[0], err
	}
	if wc[0].Status != verbs.WCSuccess {
		return wc[0], fmt.Errorf("%v %d: %v", wc[0].Opcode, wc[0].ID, wc[0].Status)
	}
	return wc[0], nil
}

func run(clientDev, serverDev string, addr netip.AddrPort, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, err := open(serverDev)
	if err != nil {
		return err
	}
	defer srv.dev.Close()
	cli, err := open(clientDev)
	if err != nil {
		return err
	}
	defer cli.dev.Close()

	// The listener: a receive for the note (in the second half of its
	// buffer), then listen, accept, and wait for the note.
	if _, err := srv.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{srv.mr.SGE(2048, 64)}}}); err != nil {
		return err
	}
	l, err := srv.dev.Listen(addr, 1)
	if err != nil {
		return err
	}
	defer l.Close()
	served := make(chan error, 1)
	var got string // what the listener found, once served has its result
	go func() {
		var err error
		got, err = serve(ctx, l, srv)
		served <- err
	}()
	if err := write(ctx, cli, addr, out); err != nil {
		return err
	}
	if err := <-served; err != nil {
		return err
	}
	_, err = io.WriteString(out, got)
	return err
}

// serve accepts one connection on l with srv's QP, offering its buffer's
// address and rkey as private data, and says what arrived in the buffer.
func serve(ctx context.Context, l *verbs.Listener, srv *end) (string, error) {
	req, err := l.Accept(ctx)
	if err != nil {
		return "", err
	}
	pdata := binary.BigEndian.AppendUint64(nil, srv.mr.Addr())  // where to write ...
	pdata = binary.BigEndian.AppendUint32(pdata, srv.mr.RKey()) // ... and with which rkey
	if err := req.Accept(srv.qp, verbs.ConnParam{PrivateData: pdata}); err != nil {
		return "", err
	}
	wc, err := srv.wait(ctx)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("listener: %q written, then %q received\n", srv.buf[:16], srv.buf[2048:2048+wc.ByteLen]), nil
}

// write is the client: it connects, takes the listener's buffer from the
// private data of the connection's ESTABLISHED event, Writes, then Sends.
func write(ctx context.Context, cli *end, addr netip.AddrPort, out io.Writer) error {
	if err := cli.qp.Connect(ctx, addr, verbs.ConnParam{}); err != nil {
		return err
	}
	var ev verbs.Event
	for ev.Type != verbs.EventEstablished {
		select {
		case ev = <-cli.qp.Events():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if len(ev.PrivateData) < 12 {
		return errors.New("the listener sent no buffer")
	}
	raddr, rkey := binary.BigEndian.Uint64(ev.PrivateData), binary.BigEndian.Uint32(ev.PrivateData[8:])
	n := copy(cli.buf, "hello over iWARP")
	if _, err := cli.qp.PostSend([]verbs.SendWR{
		{ID: 1, Opcode: verbs.WRWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{cli.mr.SGE(0, n)}, RemoteAddr: raddr, RKey: rkey},
		{ID: 2, Opcode: verbs.WRSend, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("done")},
	}); err != nil {
		return err
	}
	for range 2 {
		if _, err := cli.wait(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "client: wrote %d bytes to 0x%x (rkey 0x%x) and sent a note\n", n, raddr, rkey)
	return nil
}
