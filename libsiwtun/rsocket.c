/* rsockets (librdmacm's sockets over RDMA: rsocket, rsend, rrecv, rpoll,
 * riowrite, ...) on libsiwtun's own ids and verbs. rdma-core's
 * implementation runs inside the real librdmacm and keeps its state in
 * librdmacm's private id structure (ucma_max_qpsize, ucma_complete and its
 * other internal calls read past the public struct rdma_cm_id), so it
 * cannot run on libsiwtun's ids; this is a separate implementation of the
 * same API, stream sockets only, that speaks its own small protocol (both
 * ends must be libsiwtun rsockets):
 *
 * - Every message is a Send into one of the peer's RS_SLOTS posted
 *   receive slots of RS_SLOT bytes: an 8-octet header (length, type,
 *   credits granted) and up to RS_PAYLOAD octets of data, as rdma-core's
 *   rsockets does on iWARP (RS_OPT_MSG_SEND: iWARP has no RDMA Write with
 *   immediate data).
 * - Flow control by credits: a sender may use one of the peer's slots per
 *   message; a receiver gives slots back in the header of its own messages
 *   or, once RS_SLOTS/2 are owed, in a credit message. Data leaves one
 *   credit unused so a credit message can always be sent.
 * - riomap registers memory for RDMA Write and tells the peer (an IOMAP
 *   message: offset, address, rkey, length); riowrite writes into the
 *   peer's mapping with RDMA Write from a send slot.
 * - The connection's private data carries a magic and the slot geometry.
 *
 * The rsocket number a program gets is the socket's rdma_cm event channel
 * fd (an eventfd: unique, and a real descriptor). Progress is made by the
 * calls themselves (rrecv, rsend, rpoll, ...), which poll the socket's CQ
 * and its event channel; blocking waits poll(2) the CQ's completion
 * channel and the event channel. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "sw.h"

#define RS_SLOTS 16
#define RS_SLOT (64 * 1024)
#define RS_HDR 8
#define RS_PAYLOAD (RS_SLOT - RS_HDR)
#define RS_MAGIC 0x73777231u /* "swr1" */
#define RS_MAPS 8
#define RS_WR_RECV (1ull << 63)

enum { RS_DATA = 1, RS_CREDIT, RS_IOMAP, RS_SHUTDOWN };

enum { RS_INIT, RS_BOUND, RS_LISTEN, RS_CONNECTING, RS_CONNECTED, RS_ERROR };

/* The private data of a connection request and its acceptance. */
struct rs_conn_pd {
	uint32_t magic;
	uint16_t slots;
	uint16_t reserved;
	uint32_t slot_size;
};

struct rs_lmap { /* a local riomap */
	off_t off;
	void *addr;
	size_t len;
	struct ibv_mr *mr;
};

struct rs_rmap { /* the peer's riomap */
	uint64_t off, addr, len;
	uint32_t rkey;
	int valid;
};

struct rs {
	int fd; /* the number the program holds: ch->fd */
	pthread_mutex_t mu;
	int state, err, nonblock;
	int rd_eof, wr_shut, gone; /* peer's SHUTDOWN; our SHUT_WR; disconnected */
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	uint8_t *sbuf, *rbuf;
	struct ibv_mr *smr, *rmr;
	int sfree[RS_SLOTS], nsfree;
	struct { /* received data messages in order */
		int slot;
		uint32_t len, off;
	} rq[RS_SLOTS];
	int rq_head, rq_n;
	int credits, owed;
	int cq_armed;
	/* listener: connection requests seen, not yet accepted */
	struct rdma_cm_event *reqs[64];
	int nreqs;
	struct sockaddr_storage bound;
	int sndbuf, rcvbuf, nodelay, keepalive, reuse, inline_size, iomap_size;
	struct rs_lmap lmaps[RS_MAPS];
	struct rs_rmap rmaps[RS_MAPS];
	struct rs *next;
};

static pthread_mutex_t rs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rs *rs_list;

static int fail(int err)
{
	errno = err;
	return -1;
}

static struct rs *rs_get(int fd)
{
	pthread_mutex_lock(&rs_mu);
	struct rs *s = rs_list;
	while (s && s->fd != fd)
		s = s->next;
	pthread_mutex_unlock(&rs_mu);
	return s;
}

static struct rs *rs_new(void)
{
	struct rs *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->ch = rdma_create_event_channel();
	if (!s->ch) {
		free(s);
		return NULL;
	}
	fcntl(s->ch->fd, F_SETFL, fcntl(s->ch->fd, F_GETFL) | O_NONBLOCK);
	s->fd = s->ch->fd;
	pthread_mutex_init(&s->mu, NULL);
	s->sndbuf = s->rcvbuf = RS_SLOTS * RS_PAYLOAD;
	s->inline_size = 64;
	pthread_mutex_lock(&rs_mu);
	s->next = rs_list;
	rs_list = s;
	pthread_mutex_unlock(&rs_mu);
	return s;
}

static void rs_free_res(struct rs *s)
{
	for (int i = 0; i < RS_MAPS; i++)
		if (s->lmaps[i].mr) {
			ibv_dereg_mr(s->lmaps[i].mr);
			s->lmaps[i].mr = NULL;
		}
	if (s->id && s->id->qp)
		rdma_destroy_qp(s->id);
	if (s->smr)
		ibv_dereg_mr(s->smr);
	if (s->rmr)
		ibv_dereg_mr(s->rmr);
	s->smr = s->rmr = NULL;
	if (s->cq) {
		if (s->cq_armed) {
			/* an event may be pending on the channel: take it */
			struct pollfd p = {.fd = s->cc->fd, .events = POLLIN};
			struct ibv_cq *cq;
			void *ctx;
			if (poll(&p, 1, 0) == 1 && !ibv_get_cq_event(s->cc, &cq, &ctx))
				ibv_ack_cq_events(cq, 1);
		}
		ibv_destroy_cq(s->cq);
	}
	if (s->cc)
		ibv_destroy_comp_channel(s->cc);
	if (s->pd)
		ibv_dealloc_pd(s->pd);
	s->cq = NULL;
	s->cc = NULL;
	s->pd = NULL;
	free(s->sbuf);
	free(s->rbuf);
	s->sbuf = s->rbuf = NULL;
}

static void rs_destroy(struct rs *s)
{
	pthread_mutex_lock(&rs_mu);
	SW_UNLINK(&rs_list, s);
	pthread_mutex_unlock(&rs_mu);
	for (int i = 0; i < s->nreqs; i++) {
		struct rdma_cm_id *cid = s->reqs[i]->id;
		rdma_ack_cm_event(s->reqs[i]);
		rdma_reject(cid, NULL, 0);
		rdma_destroy_id(cid);
	}
	rs_free_res(s);
	if (s->id)
		rdma_destroy_id(s->id);
	rdma_destroy_event_channel(s->ch);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

/* ---- the connection's verbs resources ---- */

static int post_recv(struct rs *s, int slot)
{
	struct ibv_sge sge = {.addr = (uintptr_t)(s->rbuf + (size_t)slot * RS_SLOT), .length = RS_SLOT, .lkey = s->rmr->lkey};
	struct ibv_recv_wr wr = {.wr_id = RS_WR_RECV | (uint64_t)slot, .sg_list = &sge, .num_sge = 1}, *bad;
	return ibv_post_recv(s->id->qp, &wr, &bad);
}

/* rs_setup makes the PD, CQ, buffers and QP of a connection on s->id and
 * posts every receive slot. */
static int rs_setup(struct rs *s)
{
	struct ibv_context *c = s->id->verbs;
	if (!c)
		return EINVAL;
	s->pd = ibv_alloc_pd(c);
	s->cc = s->pd ? ibv_create_comp_channel(c) : NULL;
	s->cq = s->cc ? ibv_create_cq(c, 4 * RS_SLOTS + 8, s, s->cc, 0) : NULL;
	s->sbuf = malloc((size_t)RS_SLOTS * RS_SLOT);
	s->rbuf = malloc((size_t)RS_SLOTS * RS_SLOT);
	if (!s->cq || !s->sbuf || !s->rbuf)
		return errno ? errno : ENOMEM;
	fcntl(s->cc->fd, F_SETFL, fcntl(s->cc->fd, F_GETFL) | O_NONBLOCK);
	s->smr = ibv_reg_mr(s->pd, s->sbuf, (size_t)RS_SLOTS * RS_SLOT, IBV_ACCESS_LOCAL_WRITE);
	s->rmr = ibv_reg_mr(s->pd, s->rbuf, (size_t)RS_SLOTS * RS_SLOT, IBV_ACCESS_LOCAL_WRITE);
	if (!s->smr || !s->rmr)
		return errno ? errno : ENOMEM;
	struct ibv_qp_init_attr a = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
		.cap = {.max_send_wr = 2 * RS_SLOTS + 4, .max_recv_wr = RS_SLOTS, .max_send_sge = 1, .max_recv_sge = 1},
	};
	if (rdma_create_qp(s->id, s->pd, &a))
		return errno;
	for (int i = 0; i < RS_SLOTS; i++) {
		s->sfree[i] = i;
		int err = post_recv(s, i);
		if (err)
			return err;
	}
	s->nsfree = RS_SLOTS;
	s->credits = RS_SLOTS;
	return 0;
}

/* ---- progress ---- */

static void put_hdr(uint8_t *p, uint32_t len, uint16_t type, uint16_t credits)
{
	memcpy(p, &len, 4);
	memcpy(p + 4, &type, 2);
	memcpy(p + 6, &credits, 2);
}

/* send_msg posts a Send (type, payload) from a free slot; the caller has
 * checked a slot and a credit are there. It grants the owed credits. */
static int send_msg(struct rs *s, uint16_t type, const void *data, uint32_t len)
{
	int slot = s->sfree[--s->nsfree];
	uint8_t *p = s->sbuf + (size_t)slot * RS_SLOT;
	put_hdr(p, len, type, (uint16_t)s->owed);
	if (len)
		memcpy(p + RS_HDR, data, len);
	struct ibv_sge sge = {.addr = (uintptr_t)p, .length = RS_HDR + len, .lkey = s->smr->lkey};
	struct ibv_send_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND}, *bad;
	if (RS_HDR + len <= (uint32_t)s->inline_size && RS_HDR + len <= SW_MAX_INLINE)
		wr.send_flags = IBV_SEND_INLINE;
	int err = ibv_post_send(s->id->qp, &wr, &bad);
	if (err) {
		s->sfree[s->nsfree++] = slot;
		return err;
	}
	s->owed = 0;
	s->credits--;
	return 0;
}

static void maybe_grant(struct rs *s)
{
	if (s->state == RS_CONNECTED && !s->gone && s->owed >= RS_SLOTS / 2 && s->credits >= 1 && s->nsfree > 0)
		send_msg(s, RS_CREDIT, NULL, 0);
}

static void repost(struct rs *s, int slot)
{
	if (s->gone || post_recv(s, slot))
		return;
	s->owed++;
}

static void on_recv(struct rs *s, int slot, uint32_t bytes)
{
	const uint8_t *p = s->rbuf + (size_t)slot * RS_SLOT;
	uint32_t len;
	uint16_t type, credits;
	if (bytes < RS_HDR) {
		s->err = EPROTO;
		return;
	}
	memcpy(&len, p, 4);
	memcpy(&type, p + 4, 2);
	memcpy(&credits, p + 6, 2);
	s->credits += credits;
	if (len > bytes - RS_HDR) {
		s->err = EPROTO;
		return;
	}
	switch (type) {
	case RS_DATA:
		if (len > 0) {
			int i = (s->rq_head + s->rq_n) % RS_SLOTS;
			s->rq[i].slot = slot;
			s->rq[i].len = len;
			s->rq[i].off = 0;
			s->rq_n++;
			return;
		}
		break;
	case RS_IOMAP:
		if (len >= 28) {
			struct rs_rmap m = {.valid = 1};
			memcpy(&m.off, p + RS_HDR, 8);
			memcpy(&m.addr, p + RS_HDR + 8, 8);
			memcpy(&m.len, p + RS_HDR + 16, 8);
			memcpy(&m.rkey, p + RS_HDR + 24, 4);
			int free_i = -1;
			for (int i = 0; i < RS_MAPS; i++) {
				if (s->rmaps[i].valid && s->rmaps[i].off == m.off)
					free_i = i; /* a new mapping at the same offset replaces the old */
				else if (!s->rmaps[i].valid && free_i < 0)
					free_i = i;
			}
			if (free_i < 0)
				free_i = 0;
			s->rmaps[free_i] = m;
		}
		break;
	case RS_SHUTDOWN:
		s->rd_eof = 1;
		break;
	}
	repost(s, slot);
}

/* poll_cq takes every completion; returns how many. */
static int poll_cq(struct rs *s)
{
	if (!s->cq)
		return 0;
	struct ibv_wc wc[16];
	int total = 0, n;
	while ((n = ibv_poll_cq(s->cq, 16, wc)) > 0) {
		total += n;
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				s->gone = 1;
				if (wc[i].status != IBV_WC_WR_FLUSH_ERR && !s->err)
					s->err = ECONNRESET;
				if (!(wc[i].wr_id & RS_WR_RECV))
					s->sfree[s->nsfree++] = (int)wc[i].wr_id;
				continue;
			}
			if (wc[i].wr_id & RS_WR_RECV)
				on_recv(s, (int)(wc[i].wr_id & 0xffff), wc[i].byte_len);
			else
				s->sfree[s->nsfree++] = (int)wc[i].wr_id;
		}
	}
	return total;
}

/* take_cq_event takes a completion channel event, if there is one. */
static void take_cq_event(struct rs *s)
{
	struct ibv_cq *cq;
	void *ctx;
	if (s->cc && s->cq_armed && !ibv_get_cq_event(s->cc, &cq, &ctx)) {
		ibv_ack_cq_events(cq, 1);
		s->cq_armed = 0;
	}
}

static void cm_event(struct rs *s, struct rdma_cm_event *e)
{
	switch (e->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		if (s->nreqs < 64) {
			s->reqs[s->nreqs++] = e;
			return; /* acked when accepted */
		}
		{
			struct rdma_cm_id *cid = e->id;
			rdma_reject(cid, NULL, 0);
			rdma_ack_cm_event(e); /* before the id goes (rdma_destroy_id waits for it) */
			rdma_destroy_id(cid);
		}
		return;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (s->state == RS_CONNECTING)
			s->state = RS_CONNECTED;
		break;
	case RDMA_CM_EVENT_REJECTED:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		s->state = RS_ERROR;
		s->err = e->event == RDMA_CM_EVENT_UNREACHABLE ? ETIMEDOUT : ECONNREFUSED;
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		s->gone = 1;
		if (s->state == RS_CONNECTING) {
			s->state = RS_ERROR;
			s->err = ECONNRESET;
		}
		break;
	default:
		break;
	}
	rdma_ack_cm_event(e);
}

/* progress takes what came: CM events and completions (s->mu held). */
static void progress(struct rs *s)
{
	struct rdma_cm_event *e;
	while (!rdma_get_cm_event(s->ch, &e))
		cm_event(s, e);
	take_cq_event(s);
	poll_cq(s);
	maybe_grant(s);
}

/* rs_wait sleeps until the socket's CQ or event channel has something,
 * or ms milliseconds pass (-1: no limit), s->mu released meanwhile. */
static void rs_wait(struct rs *s, int ms)
{
	if (s->cq && !s->cq_armed) {
		if (!ibv_req_notify_cq(s->cq, 0))
			s->cq_armed = 1;
		if (poll_cq(s) > 0)
			return; /* came while arming */
	}
	struct pollfd p[2] = {{.fd = s->ch->fd, .events = POLLIN}, {.fd = s->cc ? s->cc->fd : -1, .events = POLLIN}};
	pthread_mutex_unlock(&s->mu);
	poll(p, 2, ms);
	pthread_mutex_lock(&s->mu);
}

/* ---- sockets ---- */

SW_EXPORT int rsocket(int domain, int type, int protocol)
{
	if (domain != AF_INET && domain != AF_INET6)
		return fail(EAFNOSUPPORT);
	int nonblock = type & SOCK_NONBLOCK;
	type &= ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (type != SOCK_STREAM)
		return fail(EOPNOTSUPP); /* datagram rsockets need UD: iWARP has none */
	if (protocol && protocol != IPPROTO_TCP)
		return fail(EPROTONOSUPPORT);
	struct rs *s = rs_new();
	if (!s)
		return -1;
	if (rdma_create_id(s->ch, &s->id, s, RDMA_PS_TCP)) {
		int e = errno;
		rs_destroy(s);
		return fail(e);
	}
	s->nonblock = nonblock != 0;
	return s->fd;
}

SW_EXPORT int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	if (!addr || addrlen < sizeof(struct sockaddr_in) || addrlen > sizeof(s->bound))
		return fail(EINVAL);
	pthread_mutex_lock(&s->mu);
	int ret = 0;
	if (s->state != RS_INIT)
		ret = fail(EINVAL);
	else if (!(ret = rdma_bind_addr(s->id, (struct sockaddr *)addr))) {
		memcpy(&s->bound, addr, addrlen);
		s->state = RS_BOUND;
	}
	pthread_mutex_unlock(&s->mu);
	return ret;
}

SW_EXPORT int rlisten(int socket, int backlog)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	pthread_mutex_lock(&s->mu);
	int ret = s->state == RS_LISTEN ? 0 : s->state != RS_BOUND ? fail(EINVAL) : rdma_listen(s->id, backlog);
	if (!ret)
		s->state = RS_LISTEN;
	pthread_mutex_unlock(&s->mu);
	return ret;
}

static socklen_t sa_len(const struct sockaddr *sa)
{
	return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

static void copy_addr(struct sockaddr *dst, socklen_t *len, const struct sockaddr *src)
{
	if (!dst || !len)
		return;
	socklen_t n = sa_len(src);
	memcpy(dst, src, n < *len ? n : *len);
	*len = n;
}

/* wait_established waits (blocking) for the connection of s to come up or
 * fail. */
static int wait_established(struct rs *s)
{
	while (s->state == RS_CONNECTING) {
		progress(s);
		if (s->state != RS_CONNECTING)
			break;
		rs_wait(s, 100);
	}
	return s->state == RS_CONNECTED ? 0 : (s->err ? s->err : ECONNREFUSED);
}

static int accept_one(struct rs *l, struct rdma_cm_event *e, struct rs **out)
{
	struct rdma_cm_id *cid = e->id;
	const struct rs_conn_pd *pd = e->param.conn.private_data;
	struct rs_conn_pd want = {.magic = RS_MAGIC, .slots = RS_SLOTS, .slot_size = RS_SLOT};
	int ok = e->param.conn.private_data_len >= sizeof(want) && pd && pd->magic == want.magic &&
		 pd->slots == want.slots && pd->slot_size == want.slot_size;
	rdma_ack_cm_event(e);
	if (!ok) {
		rdma_reject(cid, NULL, 0);
		rdma_destroy_id(cid);
		return ECONNABORTED;
	}
	struct rs *s = rs_new();
	if (!s) {
		rdma_reject(cid, NULL, 0);
		rdma_destroy_id(cid);
		return ENOMEM;
	}
	s->id = cid;
	cid->context = s;
	s->nonblock = l->nonblock;
	s->sndbuf = l->sndbuf;
	s->rcvbuf = l->rcvbuf;
	s->nodelay = l->nodelay;
	s->inline_size = l->inline_size;
	s->iomap_size = l->iomap_size;
	pthread_mutex_lock(&s->mu);
	int err = rdma_migrate_id(cid, s->ch) ? errno : rs_setup(s);
	if (!err) {
		struct rdma_conn_param p = {.private_data = &want, .private_data_len = sizeof(want),
					    .responder_resources = 1, .initiator_depth = 1};
		s->state = RS_CONNECTING;
		if (rdma_accept(cid, &p))
			err = errno;
		else
			err = wait_established(s);
	}
	pthread_mutex_unlock(&s->mu);
	if (err) {
		if (s->state != RS_CONNECTED)
			rdma_reject(cid, NULL, 0);
		rs_destroy(s);
		return err;
	}
	*out = s;
	return 0;
}

SW_EXPORT int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	struct rs *l = rs_get(socket);
	if (!l)
		return fail(EBADF);
	pthread_mutex_lock(&l->mu);
	if (l->state != RS_LISTEN) {
		pthread_mutex_unlock(&l->mu);
		return fail(EINVAL);
	}
	for (;;) {
		progress(l);
		if (l->nreqs > 0) {
			struct rdma_cm_event *e = l->reqs[0];
			memmove(l->reqs, l->reqs + 1, (size_t)--l->nreqs * sizeof(l->reqs[0]));
			pthread_mutex_unlock(&l->mu);
			struct rs *s;
			int err = accept_one(l, e, &s);
			if (!err) {
				copy_addr(addr, addrlen, rdma_get_peer_addr(s->id));
				return s->fd;
			}
			pthread_mutex_lock(&l->mu);
			continue;
		}
		if (l->nonblock) {
			pthread_mutex_unlock(&l->mu);
			return fail(EAGAIN);
		}
		rs_wait(l, -1);
	}
}

/* wait_cm waits for the next CM event of a connecting socket. */
static struct rdma_cm_event *wait_cm(struct rs *s)
{
	struct rdma_cm_event *e;
	for (int i = 0; i < 100; i++) {
		if (!rdma_get_cm_event(s->ch, &e))
			return e;
		struct pollfd p = {.fd = s->ch->fd, .events = POLLIN};
		poll(&p, 1, 100);
	}
	errno = ETIMEDOUT;
	return NULL;
}

SW_EXPORT int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	if (!addr || addrlen < sizeof(struct sockaddr_in))
		return fail(EINVAL);
	pthread_mutex_lock(&s->mu);
	int err = 0;
	if (s->state == RS_CONNECTING) {
		err = EALREADY;
		goto out;
	}
	if (s->state == RS_CONNECTED) {
		err = EISCONN;
		goto out;
	}
	if (s->state != RS_INIT && s->state != RS_BOUND) {
		err = EINVAL;
		goto out;
	}
	struct sockaddr *src = s->state == RS_BOUND ? (struct sockaddr *)&s->bound : NULL;
	if (rdma_resolve_addr(s->id, src, (struct sockaddr *)addr, 2000)) {
		err = errno;
		goto out;
	}
	for (int step = 0; step < 2; step++) {
		struct rdma_cm_event *e = wait_cm(s);
		if (!e) {
			err = errno;
			goto out;
		}
		enum rdma_cm_event_type t = e->event;
		rdma_ack_cm_event(e);
		if (t != (step ? RDMA_CM_EVENT_ROUTE_RESOLVED : RDMA_CM_EVENT_ADDR_RESOLVED)) {
			err = EHOSTUNREACH;
			goto out;
		}
		if (!step && rdma_resolve_route(s->id, 2000)) {
			err = errno;
			goto out;
		}
	}
	if ((err = rs_setup(s)))
		goto out;
	struct rs_conn_pd pd = {.magic = RS_MAGIC, .slots = RS_SLOTS, .slot_size = RS_SLOT};
	struct rdma_conn_param p = {.private_data = &pd, .private_data_len = sizeof(pd), .responder_resources = 1,
				    .initiator_depth = 1};
	s->state = RS_CONNECTING;
	if (rdma_connect(s->id, &p)) {
		err = errno;
		s->state = RS_ERROR;
		goto out;
	}
	if (s->nonblock) {
		err = EINPROGRESS;
		goto out;
	}
	err = wait_established(s);
out:
	if (err && err != EINPROGRESS && err != EALREADY && err != EISCONN)
		s->err = 0; /* reported here */
	pthread_mutex_unlock(&s->mu);
	return err ? fail(err) : 0;
}

/* ---- data ---- */

static ssize_t do_recv(struct rs *s, struct iovec *iov, int iovcnt, int flags)
{
	size_t want = 0, got = 0;
	for (int i = 0; i < iovcnt; i++)
		want += iov[i].iov_len;
	int nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	int vi = 0;
	size_t voff = 0;
	pthread_mutex_lock(&s->mu);
	if (s->state != RS_CONNECTED && s->state != RS_CONNECTING) {
		pthread_mutex_unlock(&s->mu);
		return fail(ENOTCONN);
	}
	while (got < want) {
		progress(s);
		while (s->rq_n > 0 && got < want) {
			int h = s->rq_head;
			const uint8_t *p = s->rbuf + (size_t)s->rq[h].slot * RS_SLOT + RS_HDR + s->rq[h].off;
			size_t n = s->rq[h].len - s->rq[h].off;
			if (n > iov[vi].iov_len - voff)
				n = iov[vi].iov_len - voff;
			memcpy((uint8_t *)iov[vi].iov_base + voff, p, n);
			got += n;
			voff += n;
			if (voff == iov[vi].iov_len) {
				vi++;
				voff = 0;
			}
			if (flags & MSG_PEEK)
				break;
			s->rq[h].off += (uint32_t)n;
			if (s->rq[h].off == s->rq[h].len) {
				s->rq_head = (h + 1) % RS_SLOTS;
				s->rq_n--;
				repost(s, s->rq[h].slot);
			}
		}
		maybe_grant(s);
		if (got > 0 && (!(flags & MSG_WAITALL) || (flags & MSG_PEEK)))
			break;
		if (got == want || s->rd_eof || s->gone || s->state == RS_ERROR)
			break;
		if (nonblock)
			break;
		rs_wait(s, -1);
	}
	int err = s->state == RS_ERROR ? (s->err ? s->err : ECONNRESET) : 0;
	pthread_mutex_unlock(&s->mu);
	if (got > 0 || (s->rd_eof || s->gone) || want == 0)
		return (ssize_t)got;
	if (err)
		return fail(err);
	return fail(EAGAIN);
}

static ssize_t do_send(struct rs *s, const struct iovec *iov, int iovcnt, int flags)
{
	size_t want = 0, sent = 0;
	for (int i = 0; i < iovcnt; i++)
		want += iov[i].iov_len;
	int nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	int vi = 0;
	size_t voff = 0;
	pthread_mutex_lock(&s->mu);
	if (s->state == RS_CONNECTING && !nonblock)
		wait_established(s);
	int err = 0;
	while (sent < want) {
		progress(s);
		if (s->wr_shut || s->gone || s->state == RS_ERROR) {
			err = s->state == RS_ERROR && s->err ? s->err : EPIPE;
			break;
		}
		if (s->state != RS_CONNECTED) {
			err = s->state == RS_CONNECTING ? EAGAIN : ENOTCONN;
			if (!nonblock && s->state == RS_CONNECTING) {
				rs_wait(s, 100);
				continue;
			}
			break;
		}
		if (s->credits >= 2 && s->nsfree > 0) {
			/* gather up to one slot's payload from the iovecs */
			int slot = s->sfree[s->nsfree - 1];
			uint8_t *p = s->sbuf + (size_t)slot * RS_SLOT + RS_HDR;
			uint32_t n = 0;
			while (n < RS_PAYLOAD && sent + n < want) {
				size_t c = iov[vi].iov_len - voff;
				if (c > RS_PAYLOAD - n)
					c = RS_PAYLOAD - n;
				memcpy(p + n, (const uint8_t *)iov[vi].iov_base + voff, c);
				n += (uint32_t)c;
				voff += c;
				if (voff == iov[vi].iov_len) {
					vi++;
					voff = 0;
				}
			}
			/* send_msg copies from data: here the payload is in
			 * place already, so send it from the slot itself */
			s->nsfree--;
			put_hdr(p - RS_HDR, n, RS_DATA, (uint16_t)s->owed);
			struct ibv_sge sge = {.addr = (uintptr_t)(p - RS_HDR), .length = RS_HDR + n, .lkey = s->smr->lkey};
			struct ibv_send_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND},
					   *bad;
			if (RS_HDR + n <= (uint32_t)s->inline_size && RS_HDR + n <= SW_MAX_INLINE)
				wr.send_flags = IBV_SEND_INLINE;
			if ((err = ibv_post_send(s->id->qp, &wr, &bad))) {
				s->nsfree++;
				break;
			}
			s->owed = 0;
			s->credits--;
			sent += n;
			continue;
		}
		if (nonblock) {
			err = EAGAIN;
			break;
		}
		rs_wait(s, -1);
	}
	pthread_mutex_unlock(&s->mu);
	if (sent > 0 || want == 0)
		return (ssize_t)sent;
	return fail(err ? err : EAGAIN);
}

SW_EXPORT ssize_t rrecv(int socket, void *buf, size_t len, int flags)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	struct iovec v = {.iov_base = buf, .iov_len = len};
	return do_recv(s, &v, 1, flags);
}

SW_EXPORT ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags, struct sockaddr *src_addr, socklen_t *addrlen)
{
	ssize_t n = rrecv(socket, buf, len, flags);
	struct rs *s = rs_get(socket);
	if (n >= 0 && s && src_addr && addrlen)
		copy_addr(src_addr, addrlen, rdma_get_peer_addr(s->id));
	return n;
}

SW_EXPORT ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	if (msg->msg_control && msg->msg_controllen)
		return fail(ENOTSUP);
	return do_recv(s, msg->msg_iov, (int)msg->msg_iovlen, flags);
}

SW_EXPORT ssize_t rread(int socket, void *buf, size_t count) { return rrecv(socket, buf, count, 0); }

SW_EXPORT ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	return do_recv(s, (struct iovec *)iov, iovcnt, 0);
}

SW_EXPORT ssize_t rsend(int socket, const void *buf, size_t len, int flags)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
	return do_send(s, &v, 1, flags);
}

SW_EXPORT ssize_t rsendto(int socket, const void *buf, size_t len, int flags, const struct sockaddr *dest_addr,
			  socklen_t addrlen)
{
	if (dest_addr || addrlen)
		return fail(EISCONN);
	return rsend(socket, buf, len, flags);
}

SW_EXPORT ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	if (msg->msg_control && msg->msg_controllen)
		return fail(ENOTSUP);
	return do_send(s, msg->msg_iov, (int)msg->msg_iovlen, flags);
}

SW_EXPORT ssize_t rwrite(int socket, const void *buf, size_t count) { return rsend(socket, buf, count, 0); }

SW_EXPORT ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	return do_send(s, iov, iovcnt, 0);
}

/* ---- readiness ---- */

static short rs_revents(struct rs *s, short events)
{
	short r = 0;
	if (s->state == RS_LISTEN) {
		if (s->nreqs > 0)
			r |= POLLIN;
	} else if (s->state == RS_CONNECTED) {
		if (s->rq_n > 0 || s->rd_eof || s->gone)
			r |= POLLIN;
		if ((s->credits >= 2 && s->nsfree > 0 && !s->wr_shut) || s->gone)
			r |= POLLOUT;
		/* As TCP: the peer's close reads as EOF (POLLIN) while data
		 * is left to read, and as a hangup once it is read. */
		if (s->gone && s->rq_n == 0)
			r |= POLLHUP;
	} else if (s->state == RS_ERROR) {
		r |= POLLERR | POLLHUP | POLLIN | POLLOUT;
	}
	return r & (events | POLLERR | POLLHUP);
}

/* ms_since is the time from t0 (CLOCK_MONOTONIC) to now in milliseconds. */
static long ms_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* rs_ready_or_arm returns which of events s has now (with s->mu held),
 * after making progress; when none, it arms s's CQ first, so that the
 * completion channel wakes poll. */
static short rs_ready_or_arm(struct rs *s, short events)
{
	progress(s);
	short r = rs_revents(s, events);
	if (!r) {
		if (s->cq && !s->cq_armed && !ibv_req_notify_cq(s->cq, 0))
			s->cq_armed = 1;
		if (poll_cq(s) > 0) /* came while arming */
			r = rs_revents(s, events);
	}
	return r;
}

/* rpoll_gather sets the revents of fds' rsockets and fills pf with what
 * poll must watch: each other descriptor as given, and each rsocket's
 * rdma_cm event channel and (once it has one) its completion channel,
 * whose wakeups let it make progress. It returns how many rsockets are ready and
 * sets *npf to pf's length. */
static int rpoll_gather(struct pollfd *fds, nfds_t nfds, struct pollfd *pf, nfds_t *npf)
{
	int ready = 0;
	nfds_t n = 0;
	for (nfds_t i = 0; i < nfds; i++) {
		struct rs *s = fds[i].fd >= 0 ? rs_get(fds[i].fd) : NULL;
		fds[i].revents = 0;
		if (!s) {
			pf[n++] = fds[i];
			continue;
		}
		pthread_mutex_lock(&s->mu);
		fds[i].revents = rs_ready_or_arm(s, fds[i].events);
		pf[n++] = (struct pollfd){.fd = s->ch->fd, .events = POLLIN};
		if (s->cc)
			pf[n++] = (struct pollfd){.fd = s->cc->fd, .events = POLLIN};
		pthread_mutex_unlock(&s->mu);
		if (fds[i].revents)
			ready++;
	}
	*npf = n;
	return ready;
}

/* rpoll_scatter copies poll's results in pf (laid out by rpoll_gather)
 * for the descriptors that are not rsockets back into fds, and returns how
 * many of those are ready. */
static int rpoll_scatter(struct pollfd *fds, nfds_t nfds, const struct pollfd *pf)
{
	int ready = 0;
	nfds_t j = 0;
	for (nfds_t i = 0; i < nfds; i++) {
		struct rs *s = fds[i].fd >= 0 ? rs_get(fds[i].fd) : NULL;
		if (!s) {
			fds[i].revents = pf[j++].revents;
			if (fds[i].revents)
				ready++;
			continue;
		}
		j++;
		if (s->cc)
			j++;
	}
	return ready;
}

/* rpoll_wait is how long poll may sleep, in milliseconds: not at all when
 * ready, else what is left of timeout since t0; at most 100 ms, so that a
 * wakeup lost between progress and poll costs no more than that. */
static int rpoll_wait(int ready, int timeout, const struct timespec *t0)
{
	int wait = timeout;
	if (ready) {
		wait = 0;
	} else if (timeout > 0) {
		long el = ms_since(t0);
		wait = el >= timeout ? 0 : (int)(timeout - el);
	}
	if (wait < 0 || wait > 100)
		wait = 100;
	return wait;
}

/* rpoll polls rsockets and other descriptors together: each round makes
 * the rsockets progress, sleeps in poll on their channels and the other
 * descriptors, and ends when any is ready or timeout has passed. */
SW_EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	struct pollfd *pf = calloc(2 * nfds + 1, sizeof(*pf));
	if (!pf)
		return fail(ENOMEM);
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int ret;
	for (;;) {
		nfds_t n;
		int ready = rpoll_gather(fds, nfds, pf, &n);
		if (poll(pf, n, rpoll_wait(ready, timeout, &t0)) < 0) {
			ret = -1;
			break;
		}
		ready += rpoll_scatter(fds, nfds, pf);
		if (ready) {
			ret = ready;
			break;
		}
		if (timeout == 0 || (timeout > 0 && ms_since(&t0) >= timeout)) {
			ret = 0;
			break;
		}
	}
	free(pf);
	return ret;
}

SW_EXPORT int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, struct timeval *timeout)
{
	if (nfds < 0 || nfds > FD_SETSIZE)
		return fail(EINVAL);
	struct pollfd *p = calloc((size_t)nfds + 1, sizeof(*p));
	if (!p)
		return fail(ENOMEM);
	int n = 0;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;
		if (readfds && FD_ISSET(fd, readfds))
			ev |= POLLIN;
		if (writefds && FD_ISSET(fd, writefds))
			ev |= POLLOUT;
		if (ev || (exceptfds && FD_ISSET(fd, exceptfds)))
			p[n++] = (struct pollfd){.fd = fd, .events = ev};
	}
	int ms = timeout ? (int)(timeout->tv_sec * 1000 + timeout->tv_usec / 1000) : -1;
	int r = rpoll(p, (nfds_t)n, ms);
	if (r < 0) {
		free(p);
		return r;
	}
	if (readfds)
		FD_ZERO(readfds);
	if (writefds)
		FD_ZERO(writefds);
	if (exceptfds)
		FD_ZERO(exceptfds);
	int cnt = 0;
	for (int i = 0; i < n; i++) {
		if (readfds && (p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
			FD_SET(p[i].fd, readfds);
			cnt++;
		}
		if (writefds && (p[i].revents & (POLLOUT | POLLERR))) {
			FD_SET(p[i].fd, writefds);
			cnt++;
		}
		if (exceptfds && (p[i].revents & POLLPRI)) {
			FD_SET(p[i].fd, exceptfds);
			cnt++;
		}
	}
	free(p);
	return cnt;
}

/* ---- shutdown, close, names, options ---- */

SW_EXPORT int rshutdown(int socket, int how)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	pthread_mutex_lock(&s->mu);
	if (s->state != RS_CONNECTED) {
		pthread_mutex_unlock(&s->mu);
		return fail(ENOTCONN);
	}
	if ((how == SHUT_WR || how == SHUT_RDWR) && !s->wr_shut) {
		/* the peer's EOF: wait a moment for a credit (leaving the one
		 * kept for credit messages); without one, its EOF comes with
		 * the disconnect at rclose */
		for (int i = 0; i < 50 && !s->gone && !(s->credits >= 2 && s->nsfree > 0); i++) {
			progress(s);
			if (!(s->credits >= 2 && s->nsfree > 0))
				rs_wait(s, 20);
		}
		if (!s->gone && s->credits >= 2 && s->nsfree > 0)
			send_msg(s, RS_SHUTDOWN, NULL, 0);
		s->wr_shut = 1;
	}
	if (how == SHUT_RDWR && !s->gone) {
		/* let the last sends leave before the disconnect */
		for (int i = 0; i < 50 && s->nsfree < RS_SLOTS && !s->gone; i++) {
			progress(s);
			if (s->nsfree < RS_SLOTS)
				rs_wait(s, 20);
		}
		rdma_disconnect(s->id);
		s->gone = 1;
	}
	pthread_mutex_unlock(&s->mu);
	return 0;
}

SW_EXPORT int rclose(int socket)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	pthread_mutex_lock(&s->mu);
	if (s->state == RS_CONNECTED && !s->gone) {
		for (int i = 0; i < 50 && s->nsfree < RS_SLOTS && !s->gone; i++) {
			progress(s);
			if (s->nsfree < RS_SLOTS)
				rs_wait(s, 20);
		}
		rdma_disconnect(s->id);
	}
	pthread_mutex_unlock(&s->mu);
	rs_destroy(s);
	return 0;
}

SW_EXPORT int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	if (s->state != RS_CONNECTED && s->state != RS_CONNECTING)
		return fail(ENOTCONN);
	copy_addr(addr, addrlen, rdma_get_peer_addr(s->id));
	return 0;
}

SW_EXPORT int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	const struct sockaddr *a = rdma_get_local_addr(s->id);
	if (a->sa_family != AF_INET && a->sa_family != AF_INET6)
		a = (const struct sockaddr *)&s->bound;
	if (a->sa_family != AF_INET && a->sa_family != AF_INET6) {
		struct sockaddr_in any = {.sin_family = AF_INET};
		copy_addr(addr, addrlen, (struct sockaddr *)&any);
		return 0;
	}
	copy_addr(addr, addrlen, a);
	return 0;
}

static int opt_int(const void *v, socklen_t len, int *out)
{
	if (!v || len < sizeof(int))
		return fail(EINVAL);
	memcpy(out, v, sizeof(int));
	return 0;
}

/* rsetsockopt accepts what stream sockets set; the sizes and TCP knobs
 * are kept for rgetsockopt (the buffers are fixed: RS_SLOTS slots of
 * RS_SLOT bytes each way). */
SW_EXPORT int rsetsockopt(int socket, int level, int optname, const void *optval, socklen_t optlen)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	int v;
	if (opt_int(optval, optlen, &v))
		return -1;
	switch (level) {
	case SOL_SOCKET:
		switch (optname) {
		case SO_REUSEADDR:
			s->reuse = v;
			return 0;
		case SO_SNDBUF:
			s->sndbuf = v;
			return 0;
		case SO_RCVBUF:
			s->rcvbuf = v;
			return 0;
		case SO_KEEPALIVE:
			s->keepalive = v;
			return 0;
		case SO_LINGER:
		case SO_OOBINLINE:
			return 0;
		}
		break;
	case IPPROTO_TCP:
		switch (optname) {
		case TCP_NODELAY:
			s->nodelay = v;
			return 0;
		case TCP_MAXSEG:
		case TCP_KEEPIDLE:
		case TCP_KEEPINTVL:
		case TCP_KEEPCNT:
			return 0;
		}
		break;
	case IPPROTO_IPV6:
		if (optname == IPV6_V6ONLY)
			return 0;
		break;
	case SOL_RDMA:
		switch (optname) {
		case RDMA_SQSIZE:
		case RDMA_RQSIZE:
			return 0;
		case RDMA_INLINE:
			s->inline_size = v;
			return 0;
		case RDMA_IOMAPSIZE:
			s->iomap_size = v;
			return 0;
		}
		break;
	}
	return fail(ENOTSUP);
}

SW_EXPORT int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *optlen)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	if (!optval || !optlen || *optlen < sizeof(int))
		return fail(EINVAL);
	int v;
	pthread_mutex_lock(&s->mu);
	if (s->state == RS_CONNECTING)
		progress(s);
	pthread_mutex_unlock(&s->mu);
	switch (level) {
	case SOL_SOCKET:
		switch (optname) {
		case SO_ERROR:
			v = s->err;
			s->err = 0;
			goto out;
		case SO_REUSEADDR:
			v = s->reuse;
			goto out;
		case SO_SNDBUF:
			v = s->sndbuf;
			goto out;
		case SO_RCVBUF:
			v = s->rcvbuf;
			goto out;
		case SO_KEEPALIVE:
			v = s->keepalive;
			goto out;
		case SO_TYPE:
			v = SOCK_STREAM;
			goto out;
		}
		break;
	case IPPROTO_TCP:
		if (optname == TCP_NODELAY) {
			v = s->nodelay;
			goto out;
		}
		if (optname == TCP_MAXSEG) {
			v = RS_PAYLOAD;
			goto out;
		}
		break;
	case SOL_RDMA:
		switch (optname) {
		case RDMA_SQSIZE:
		case RDMA_RQSIZE:
			v = RS_SLOTS;
			goto out;
		case RDMA_INLINE:
			v = s->inline_size;
			goto out;
		case RDMA_IOMAPSIZE:
			v = s->iomap_size;
			goto out;
		}
		break;
	}
	return fail(ENOTSUP);
out:
	memcpy(optval, &v, sizeof(v));
	*optlen = sizeof(v);
	return 0;
}

SW_EXPORT int rfcntl(int socket, int cmd, ... /* arg */)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	va_list ap;
	va_start(ap, cmd);
	int ret = 0;
	switch (cmd) {
	case F_GETFL:
		ret = O_RDWR | (s->nonblock ? O_NONBLOCK : 0);
		break;
	case F_SETFL:
		s->nonblock = (va_arg(ap, int) & O_NONBLOCK) != 0;
		break;
	case F_GETFD:
	case F_SETFD:
		break;
	default:
		ret = fail(ENOTSUP);
	}
	va_end(ap);
	return ret;
}

/* ---- iomap ---- */

SW_EXPORT off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	if (!(prot & PROT_WRITE) || (prot & ~(PROT_WRITE | PROT_NONE)) || flags || !buf || !len)
		return fail(EINVAL);
	pthread_mutex_lock(&s->mu);
	off_t ret = -1;
	int i;
	if (s->state != RS_CONNECTED || !s->pd) {
		errno = ENOTCONN;
		goto out;
	}
	for (i = 0; i < RS_MAPS && s->lmaps[i].mr; i++)
		;
	if (i == RS_MAPS) {
		errno = ENOMEM;
		goto out;
	}
	if (offset == -1)
		offset = (off_t)(uintptr_t)buf;
	struct ibv_mr *mr = ibv_reg_mr(s->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr)
		goto out;
	/* tell the peer, leaving the credit kept for credit messages */
	while (!(s->credits >= 2 && s->nsfree > 0) && !s->gone) {
		progress(s);
		if (!(s->credits >= 2 && s->nsfree > 0))
			rs_wait(s, 100);
	}
	uint8_t m[28];
	uint64_t o = (uint64_t)offset, a = (uintptr_t)buf, l = len;
	memcpy(m, &o, 8);
	memcpy(m + 8, &a, 8);
	memcpy(m + 16, &l, 8);
	memcpy(m + 24, &mr->rkey, 4);
	int err = s->gone ? ECONNRESET : send_msg(s, RS_IOMAP, m, sizeof(m));
	if (err) {
		ibv_dereg_mr(mr);
		errno = err;
		goto out;
	}
	s->lmaps[i] = (struct rs_lmap){.off = offset, .addr = buf, .len = len, .mr = mr};
	ret = offset;
out:
	pthread_mutex_unlock(&s->mu);
	return ret;
}

SW_EXPORT int riounmap(int socket, void *buf, size_t len)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return fail(EBADF);
	pthread_mutex_lock(&s->mu);
	int ret = fail(EINVAL);
	for (int i = 0; i < RS_MAPS; i++)
		if (s->lmaps[i].mr && s->lmaps[i].addr == buf && s->lmaps[i].len == len) {
			ibv_dereg_mr(s->lmaps[i].mr);
			s->lmaps[i].mr = NULL;
			ret = 0;
			break;
		}
	pthread_mutex_unlock(&s->mu);
	return ret;
}

/* riowrite writes into the peer's riomap at offset with RDMA Write (from
 * a send slot), as much as fits in the send slots free now. */
SW_EXPORT size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)
{
	struct rs *s = rs_get(socket);
	if (!s)
		return (size_t)fail(EBADF);
	int nonblock = s->nonblock || (flags & MSG_DONTWAIT);
	size_t done = 0;
	int err = 0;
	pthread_mutex_lock(&s->mu);
	while (done < count) {
		progress(s);
		if (s->gone || s->state != RS_CONNECTED) {
			err = s->gone ? EPIPE : ENOTCONN;
			break;
		}
		uint64_t at = (uint64_t)offset + done;
		struct rs_rmap *m = NULL;
		for (int i = 0; i < RS_MAPS; i++)
			if (s->rmaps[i].valid && at >= s->rmaps[i].off && at < s->rmaps[i].off + s->rmaps[i].len)
				m = &s->rmaps[i];
		if (m && s->nsfree > 0) {
			size_t n = count - done;
			if (n > RS_SLOT)
				n = RS_SLOT;
			if (n > m->off + m->len - at)
				n = (size_t)(m->off + m->len - at);
			int slot = s->sfree[--s->nsfree];
			uint8_t *p = s->sbuf + (size_t)slot * RS_SLOT;
			memcpy(p, (const uint8_t *)buf + done, n);
			struct ibv_sge sge = {.addr = (uintptr_t)p, .length = (uint32_t)n, .lkey = s->smr->lkey};
			struct ibv_send_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1,
						 .opcode = IBV_WR_RDMA_WRITE}, *bad;
			wr.wr.rdma.remote_addr = m->addr + (at - m->off);
			wr.wr.rdma.rkey = m->rkey;
			if (n <= (size_t)s->inline_size && n <= SW_MAX_INLINE)
				wr.send_flags = IBV_SEND_INLINE;
			if ((err = ibv_post_send(s->id->qp, &wr, &bad))) {
				s->nsfree++;
				break;
			}
			done += n;
			continue;
		}
		if (!m && s->nsfree > 0 && nonblock) {
			err = EINVAL; /* no mapping there */
			break;
		}
		if (nonblock) {
			err = EAGAIN;
			break;
		}
		rs_wait(s, 100);
	}
	pthread_mutex_unlock(&s->mu);
	if (done > 0 || count == 0)
		return done;
	return (size_t)fail(err ? err : EAGAIN);
}
