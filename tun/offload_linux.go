package tun

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// TUN ioctls and offload flags (include/uapi/linux/if_tun.h).
const (
	tunSetIff     = 0x400454ca // TUNSETIFF
	tunSetOffload = 0x400454d0 // TUNSETOFFLOAD
	tunFCsum      = 0x01       // TUN_F_CSUM
	tunFTSO4      = 0x02       // TUN_F_TSO4
	tunFTSO6      = 0x04       // TUN_F_TSO6
)

// OffloadBatch is an offload device's BatchSize: the most segments one
// Read returns and the most packets one Write takes.
const OffloadBatch = 128

// offloadTun is a TUN device with segmentation offload (IFF_VNET_HDR,
// TUNSETOFFLOAD TSO4/TSO6/CSUM): Write coalesces runs of TCP segments into
// super-segments and Read splits the ones the kernel hands over (gso.go).
type offloadTun struct {
	*nativeTun

	readMu sync.Mutex
	rbuf   []byte // one frame: virtio header + packet
	split  splitter
	rhdr   [virtioHdrLen]byte // ReadSuper's virtio header
	riov   [2][]byte          // ReadSuper's readv pieces

	writeMu sync.Mutex
	iov     [][]byte // writev's pieces of one frame
	vhdr    [virtioHdrLen]byte
	hdr     [maxHeaders]byte // the super-segment's IP and TCP headers
	zero    [virtioHdrLen]byte
}

var _ Device = (*offloadTun)(nil)

// CreateOffload opens a TUN device like Create, but with segmentation
// offload: the kernel hands it TCP super-segments (up to 64 KiB) it did not
// cut, which Read splits at their gso_size, and Write hands the kernel one
// super-segment per run of equal-sized segments of one flow, which the
// kernel (or a NIC downstream) cuts back into exactly those segments. One
// system call then carries up to 64 KiB instead of one packet, and FPDUs
// aligned to segments stay aligned on the wire. It uses x/sys directly
// (water has no virtio-net header support).
func CreateOffload(name string, mtu int) (Device, error) {
	nl, err := prepare(name, mtu)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		nl.Close()
		return nil, createError(name, &os.PathError{Op: "open", Path: "/dev/net/tun", Err: err})
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		nl.Close()
		return nil, fmt.Errorf("tun: create %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, tunSetIff, ifr); err != nil {
		unix.Close(fd)
		nl.Close()
		return nil, createError(name, err)
	}
	if err := unix.IoctlSetInt(fd, tunSetOffload, tunFCsum|tunFTSO4|tunFTSO6); err != nil {
		unix.Close(fd)
		nl.Close()
		return nil, fmt.Errorf("tun: create %q: enable offloads (TUNSETOFFLOAD): %w", name, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		nl.Close()
		return nil, fmt.Errorf("tun: create %q: %w", name, err)
	}
	file := os.NewFile(uintptr(fd), "/dev/net/tun")
	t, err := newNativeTun(file, ifr.Name(), nl, mtu)
	if err != nil {
		return nil, err
	}
	return &offloadTun{nativeTun: t, rbuf: make([]byte, virtioHdrLen+maxSuper), iov: make([][]byte, 0, OffloadBatch+2)}, nil
}

// BatchSize is OffloadBatch.
func (t *offloadTun) BatchSize() int { return OffloadBatch }

// Read returns the next packets: the segments of a super-segment (split
// at its gso_size, a batch per call), or one packet, its checksum
// completed if the kernel left it partial.
func (t *offloadTun) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if len(bufs) == 0 || len(sizes) < len(bufs) {
		return 0, fmt.Errorf("tun: read %s: %d buffers, %d sizes", t.name, len(bufs), len(sizes))
	}
	t.readMu.Lock()
	defer t.readMu.Unlock()
	for {
		if !t.split.done() {
			n, err := t.split.fill(bufs, sizes, offset)
			if err != nil {
				t.split.pkt = nil
				return n, fmt.Errorf("tun: read %s: %w", t.name, err)
			}
			return n, nil
		}
		m, err := t.file.Read(t.rbuf)
		if err != nil {
			return 0, t.ioError("read", err)
		}
		if m < virtioHdrLen {
			continue
		}
		var h virtioHdr
		h.decode(t.rbuf)
		pkt := t.rbuf[virtioHdrLen:m]
		switch h.gsoType &^ virtioGSOECN {
		case virtioGSONone:
			if h.flags&virtioNeedsCsum != 0 {
				if err := completeChecksum(pkt, &h); err != nil {
					continue
				}
			}
			if len(bufs[0])-offset < len(pkt) {
				return 0, fmt.Errorf("tun: read %s: a %d-octet packet does not fit a %d-octet buffer", t.name, len(pkt), len(bufs[0])-offset)
			}
			sizes[0] = copy(bufs[0][offset:], pkt)
			return 1, nil
		case virtioGSOTCPv4, virtioGSOTCPv6:
			if err := t.split.start(pkt, &h); err != nil {
				continue // not ours to deliver: drop, as a NIC drops a bad frame
			}
		default:
			continue // UDP and other GSO types were not enabled
		}
	}
}

// ReadSuper implements SuperReader: it reads the next frame into p whole,
// a packet (gso 0) or a TCP super-segment the kernel did not cut (gso its
// gso_size; its IP length fields are set to the frame's length). A frame
// that does not fit p is dropped with an error. Checksums are the device's
// job, as a NIC's with receive checksum offload: a frame the kernel built
// (NEEDS_CSUM, its TCP or UDP checksum still partial) or vouched for
// (DATA_VALID) is handed over unchecked; any other has its IPv4 header,
// TCP and UDP checksums verified here and is dropped with an error wrapping
// ErrChecksum if one is wrong. Do not mix ReadSuper and Read on one device.
func (t *offloadTun) ReadSuper(p []byte) (n, gso int, err error) {
	t.readMu.Lock()
	defer t.readMu.Unlock()
	for {
		m, err := t.readFrame(p)
		if err != nil {
			return 0, 0, err
		}
		if m == 0 {
			continue
		}
		var h virtioHdr
		h.decode(t.rhdr[:])
		pkt := p[:m]
		switch h.gsoType &^ virtioGSOECN {
		case virtioGSONone:
			if h.flags&(virtioNeedsCsum|virtioDataValid) == 0 && !checksumsValid(pkt) {
				return 0, 0, fmt.Errorf("tun: read %s: %w", t.name, ErrChecksum)
			}
			return m, 0, nil
		case virtioGSOTCPv4, virtioGSOTCPv6:
			tp, ok := parseTCPGSO(pkt)
			if !ok || h.gsoSize == 0 {
				continue // not ours to deliver: drop, as a NIC drops a bad frame
			}
			setIPLength(pkt, tp, m)
			if tp.payload <= int(h.gsoSize) {
				return m, 0, nil // one segment's worth
			}
			return m, int(h.gsoSize), nil
		default:
			continue // UDP and other GSO types were not enabled
		}
	}
}

// readFrame reads one frame, its virtio header into t.rhdr and the packet
// into p, with one readv through the runtime poller. It returns 0 for a
// frame too short to hold a header.
func (t *offloadTun) readFrame(p []byte) (int, error) {
	rc, err := t.file.SyscallConn()
	if err != nil {
		return 0, t.ioError("read", err)
	}
	t.riov[0], t.riov[1] = t.rhdr[:], p
	var m int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		m, rerr = unix.Readv(int(fd), t.riov[:])
		return rerr != unix.EAGAIN
	})
	t.riov[1] = nil
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, t.ioError("read", err)
	}
	if m < virtioHdrLen {
		return 0, nil
	}
	if m == virtioHdrLen+len(p) {
		return 0, fmt.Errorf("tun: read %s: a frame of %d octets or more does not fit a %d-octet buffer", t.name, len(p)+1, len(p))
	}
	return m - virtioHdrLen, nil
}

// Write writes the packets bufs[i][offset:], coalescing each run of TCP
// segments that can travel as one super-segment. It returns how many
// packets went out.
func (t *offloadTun) Write(bufs [][]byte, offset int) (int, error) {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	var errs error
	sent := 0
	for i := 0; i < len(bufs); {
		if offset < 0 || offset > len(bufs[i]) {
			errs = errors.Join(errs, fmt.Errorf("tun: write %s: offset %d outside a %d-byte buffer", t.name, offset, len(bufs[i])))
			i++
			continue
		}
		r := nextRun(bufs, offset, i)
		if r.end-i > 1 {
			var vh virtioHdr
			hdr := t.hdr[:r.t.hdrLen]
			copy(hdr, bufs[i][offset:])
			superHeader(hdr, r.t, r.total, r.gso, r.psh, &vh)
			vh.encode(t.vhdr[:])
			t.iov = append(t.iov[:0], t.vhdr[:], hdr)
			for k := i; k < r.end; k++ {
				t.iov = append(t.iov, bufs[k][offset+r.t.hdrLen:])
			}
		} else {
			t.iov = append(t.iov[:0], t.zero[:], bufs[i][offset:])
		}
		err := t.writev(t.iov)
		switch {
		case err == nil:
			sent += r.end - i
		case errors.Is(err, os.ErrClosed):
			return sent, errors.Join(errs, err)
		default:
			errs = errors.Join(errs, err)
		}
		i = r.end
	}
	return sent, errs
}

// WriteFrame implements FrameWriter: one writev of the virtio-net header
// the offload asks for and the packet's pieces.
func (t *offloadTun) WriteFrame(pieces [][]byte, gso, hdrLen, csumStart, csumOffset int) error {
	if len(pieces) == 0 || len(pieces[0]) == 0 {
		return fmt.Errorf("tun: write %s: an empty frame", t.name)
	}
	var vh virtioHdr
	if csumOffset > 0 {
		vh.flags = virtioNeedsCsum
		vh.csumStart, vh.csumOffset = uint16(csumStart), uint16(csumOffset)
	}
	if gso > 0 {
		vh.gsoType = virtioGSOTCPv4
		if pieces[0][0]>>4 == 6 {
			vh.gsoType = virtioGSOTCPv6
		}
		vh.gsoSize, vh.hdrLen = uint16(gso), uint16(hdrLen)
	}
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	vh.encode(t.vhdr[:])
	t.iov = append(append(t.iov[:0], t.vhdr[:]), pieces...)
	err := t.writev(t.iov)
	clear(t.iov)
	return err
}

// writev writes one frame made of iov's pieces with one system call,
// through the runtime poller (the descriptor is non-blocking).
func (t *offloadTun) writev(iov [][]byte) error {
	rc, err := t.file.SyscallConn()
	if err != nil {
		return t.ioError("write", err)
	}
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		_, werr = unix.Writev(int(fd), iov)
		return werr != unix.EAGAIN
	})
	if err == nil {
		err = werr
	}
	if err != nil {
		return t.ioError("write", err)
	}
	return nil
}
