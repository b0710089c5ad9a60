// Package ibv is the verbs vocabulary that the engine and its clients
// share: work requests and completions, their opcodes, flags and statuses,
// memory access rights, queue pair states and limits, connection
// parameters, events and errors, and the one check of a work request that
// every backend applies (CheckSendWR, CheckRecvWR).
//
// It is a leaf: it depends on the iWARP header packages (iwarp/mpa,
// iwarp/rdmap) for a few field types and on nothing of the TCP/IP stack,
// so a program that only talks to a daemon through the verbs socket does
// not link the engine. Applications use these names through package verbs,
// which re-exports them; the offload engine uses them directly.
//
// Numeric values equal libibverbs' (rdma-core libibverbs/verbs.h), so
// users of rdma-core read them without a table, and the C compatibility
// library passes them through unchanged.
package ibv
