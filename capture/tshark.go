package capture

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// TsharkHeuristicsOff are the tshark options that switch off the RDMA
// upper-layer heuristics (RPC-over-RDMA and SMB Direct over iWARP), which
// would otherwise try to read RDMA payload as their own protocols.
var TsharkHeuristicsOff = []string{"--disable-heuristic", "rpcrdma_iwarp", "--disable-heuristic", "smb_direct_iwarp"}

// TsharkResult is what tshark's dissectors made of a capture.
type TsharkResult struct {
	// Frames counts the packets, Comments those with a packet comment.
	Frames, Comments int
	// Requests and Replies count MPA Request and Reply frames; FPDUs the
	// FPDUs Wireshark's MPA dissector decoded.
	Requests, Replies, FPDUs int
	// GoodCRC and BadCRC count "Good CRC32" and "Bad CRC32" verdicts.
	GoodCRC, BadCRC int
	// Malformed counts "Malformed Packet" items, ExpertErrors expert
	// items of severity Error.
	Malformed, ExpertErrors int
	// Lines are the output lines that show a problem (bad CRC,
	// malformed, expert error), with the frame they are in.
	Lines []string
	// Err is set when tshark could not run or failed.
	Err error
}

// RunTshark runs tshark (the binary at path tshark) over the capture file
// and counts what its dissectors say, with TsharkHeuristicsOff.
func RunTshark(ctx context.Context, tshark, file string) TsharkResult {
	args := append([]string{"-r", file, "-n", "-V"}, TsharkHeuristicsOff...)
	cmd := exec.CommandContext(ctx, tshark, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var res TsharkResult
	if err != nil {
		res.Err = fmt.Errorf("tshark %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		return res
	}
	frame := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		trim := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "Frame ") && strings.Contains(line, " bytes on wire"):
			res.Frames++
			frame = strings.SplitN(line, ":", 2)[0]
		case trim == "Packet comments":
			res.Comments++
		case trim == "Request frame header":
			res.Requests++
		case trim == "Reply frame header":
			res.Replies++
		case trim == "FPDU":
			res.FPDUs++
		case strings.Contains(line, "(Good CRC32)"):
			res.GoodCRC++
		case strings.Contains(line, "(Bad CRC32"):
			res.BadCRC++
			res.Lines = append(res.Lines, frame+": "+trim)
		}
		if strings.Contains(line, "[Malformed Packet") {
			res.Malformed++
			res.Lines = append(res.Lines, frame+": "+trim)
		}
		if strings.Contains(line, "[Expert Info (Error") {
			res.ExpertErrors++
			res.Lines = append(res.Lines, frame+": "+trim)
		}
	}
	if err := sc.Err(); err != nil {
		res.Err = fmt.Errorf("read tshark output: %w", err)
	}
	return res
}
