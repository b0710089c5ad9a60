// Package perftest runs perftest's bandwidth and latency tests (ib_write_bw,
// ib_read_bw, ib_send_bw, ib_write_lat, ib_read_lat, ib_send_lat) over a
// siwtun device, speaking perftest's rdma_cm (-R) control exchange so that
// either side can be the unmodified perftest tools of another RNIC, and
// printing perftest's report layout.
//
// The exchange is perftest 6.06's (the perftest 4.5-0.17 release): a
// control connection made with rdma_cm, over which each side sends fixed
// messages with IBV_WR_SEND, the client first: the 16-byte version, the
// page and cache-line sizes, the MTU, then 56-byte pingpong_dest structures
// (queue pair number, PSN, rkey, address, GID; integers big-endian) in the
// handshakes around the connection of the test queue pairs and before and
// after each run, and finally the bandwidth reports. The test queue pairs
// connect to the same port. Send bandwidth tests use perftest's receive
// credits for iWARP: the receiver RDMA-Writes its count of completed
// receives into the sender's credit slot every third of the receive queue,
// and the sender never has more Sends outstanding than the receiver has
// receives posted. A timed (-D) Send run, which each side ends by its own
// clock, ends with no Send on its way: the sender posts up to the count
// of the receiver's next credit and waits for that credit, the client of
// a latency run for the answer to its last ping, and the receiving side
// goes on taking Sends (and answering pings) until the peer's closing
// handshake, before it tears its queue pairs down.
//
// Registered memory is mapped outside the Go heap (the verbs socket's
// shared memory, or an anonymous mapping in-process), because the write
// latency test and the credits are read from memory the RNIC writes, as
// perftest does.
package perftest
