// Package uabi is the verbs socket's ABI, shared by the client transport
// (package verbs) and the daemon (package daemon/uverbs): the layout of the
// shared-memory work and completion rings, the helpers that create and map
// them (memfd, mmap, eventfd), and the messages on the Unix socket.
//
// Each message is one struct (messages.go), encoded and decoded by one
// codec that walks its fields in order (Enc.Msg, Dec.Msg), and Ops lists
// every op with its request and reply: the single definition of the
// protocol that both Go ends use and a C client is checked against
// (CHeader renders it as the C library's header, libsiwtun/siwtun_abi.h).
//
// The rings follow Linux siw's user ABI (kernel-headers/rdma/siw-abi.h):
// arrays of fixed-size entries in shared memory, each entry owned by the
// producer or by the consumer according to an ownership word at its start,
// stored atomically. Neither side shares an index: each keeps its own
// cursor and moves it only over entries it owns. Every ring's count is a
// power of two. Doorbells (client→daemon, one eventfd per QP) and
// completion notifications (daemon→client, one eventfd per CQ) are eventfd
// writes, made only when the other side said it sleeps (the Notify word of
// the ring header), so a busy queue costs no system call per request.
//
// The daemon treats everything in shared memory as hostile: entries are
// copied out once, then checked; memory the client passes is mapped only
// if it is a memfd sealed against shrinking.
package uabi
