/* testlib: what libsiwtun's C test programs (ctest.c, srqtest.c,
 * mwtest.c) share: the check that ends the program at the first failure,
 * the "ok NAME" report, opening a device by name, the RNIC's address,
 * rdma_cm's steps from resolving an address to the established connection,
 * and polling completions with a time limit. Every helper checks what it
 * does and exits 1 with a FAIL line when it fails. */
#ifndef SIWTUN_TESTLIB_H
#define SIWTUN_TESTLIB_H

#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* CHECK ends the program with a FAIL line (file, line, the condition, the
 * message, errno) when cond is false. */
#define CHECK(cond, ...)                                                                        \
	do {                                                                                    \
		if (!(cond)) {                                                                  \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
			fprintf(stderr, __VA_ARGS__);                                           \
			fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno));            \
			exit(1);                                                                \
		}                                                                               \
	} while (0)

/* OK reports a check passed; the Go tests look for these lines. */
#define OK(name) printf("ok %s\n", name)

/* tl_open_dev opens the device of that name, which must be listed once as
 * an iWARP RNIC with a GUID and no kernel index. */
struct ibv_context *tl_open_dev(const char *name);

/* tl_get_addr sets sin to the RNIC's IPv4 address (port 0). */
void tl_get_addr(struct ibv_context *c, struct sockaddr_in *sin);

/* tl_wait_event returns the next event of ch (within 10 s), which must be
 * want; the caller acks it. */
struct rdma_cm_event *tl_wait_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want);

/* tl_ack_event waits for the next event of ch, which must be want, and
 * acks it. */
void tl_ack_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want);

/* tl_listen returns an id of ch bound to addr and listening. */
struct rdma_cm_id *tl_listen(struct rdma_event_channel *ch, const struct sockaddr_in *addr, int backlog);

/* tl_resolve resolves id's address (from src to dst) and route, each
 * event waited for on its channel. */
void tl_resolve(struct rdma_cm_id *id, const struct sockaddr_in *src, const struct sockaddr_in *dst);

/* tl_request waits for a CONNECT_REQUEST on ch and returns its new id. */
struct rdma_cm_id *tl_request(struct rdma_event_channel *ch);

/* tl_established waits for ESTABLISHED on both channels (a, then b);
 * tl_disconnected for DISCONNECTED. */
void tl_established(struct rdma_event_channel *a, struct rdma_event_channel *b);
void tl_disconnected(struct rdma_event_channel *a, struct rdma_event_channel *b);

/* tl_poll returns one completion of cq, which must come within 20 s. */
struct ibv_wc tl_poll(struct ibv_cq *cq);

/* tl_poll_n polls n completions of cq into out, within 20 s. */
void tl_poll_n(struct ibv_cq *cq, int n, struct ibv_wc *out);

/* tl_want checks a completion's work request id, opcode and status. */
void tl_want(struct ibv_wc wc, uint64_t id, enum ibv_wc_opcode op, enum ibv_wc_status st);

/* tl_expect polls one completion of cq, checks it as tl_want does and
 * stores it in out (if not NULL). */
void tl_expect(struct ibv_cq *cq, enum ibv_wc_opcode op, enum ibv_wc_status st, uint64_t id, struct ibv_wc *out);

#endif
