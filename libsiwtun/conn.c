/* The verbs socket session: requests, replies and events, with one reader
 * thread per session (uabi/wire.go; verbs/remote.go is the Go client). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "sw.h"

int sw_conn_dial(const char *path, struct sw_conn **out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path))
		return ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return e;
	}
	struct sw_conn *c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return ENOMEM;
	}
	c->fd = fd;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	pthread_mutex_init(&c->wmu, NULL);
	*out = c;
	return 0;
}

void sw_close_fds(struct sw_reply *r)
{
	for (int i = 0; i < r->nfds; i++)
		if (r->fds[i] >= 0)
			close(r->fds[i]);
	r->nfds = 0;
}

static void fill_reply(struct sw_reply *r, const uint8_t *body, size_t n, int *fds, int nfds)
{
	struct sw_dec d = {body, n, 0};
	r->st = sw_dec_u32(&d);
	r->msg[0] = 0;
	if (r->st != SW_ST_OK)
		sw_dec_str(&d, r->msg, sizeof(r->msg));
	if (d.err) {
		r->st = SW_ST_BAD_MESSAGE;
		d.n = 0;
	}
	memcpy(r->body, d.p, d.n);
	r->blen = d.n;
	r->nfds = nfds;
	for (int i = 0; i < nfds; i++)
		r->fds[i] = fds[i];
}

/* take_call removes the pending call seq from c's list and returns it
 * (NULL if there is none). */
static struct sw_call *take_call(struct sw_conn *c, uint32_t seq)
{
	pthread_mutex_lock(&c->mu);
	struct sw_call **pp = &c->calls, *call = NULL;
	for (; *pp; pp = &(*pp)->next) {
		if ((*pp)->seq == seq) {
			call = *pp;
			*pp = call->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->mu);
	return call;
}

/* finish_call hands call its filled reply: its callback, or its waiter. */
static void finish_call(struct sw_conn *c, struct sw_call *call)
{
	if (call->cb) {
		call->cb(c, call->r, call->arg);
		free(call->r);
		free(call);
		return;
	}
	pthread_mutex_lock(&c->mu);
	call->done = 1;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

/* close_all closes the n descriptors of fds. */
static void close_all(const int *fds, int n)
{
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

/* take_fds collects the descriptors that came with the message mh into
 * fds (room for SW_MAX_FDS + 1: one more than a message may carry, so that
 * too many is seen) and returns how many; any beyond that it closes. */
static int take_fds(struct msghdr *mh, int *fds)
{
	int nfds = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		int *p = (int *)CMSG_DATA(cm);
		for (int i = 0; i < k; i++) {
			if (nfds < SW_MAX_FDS + 1)
				fds[nfds++] = p[i];
			else
				close(p[i]);
		}
	}
	return nfds;
}

static uint32_t get_le32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* fail_bad_reply handles a message of n bytes in buf that is malformed or
 * lost its descriptors (the kernel could not pass them: this process is at
 * its open-file limit; flags are recvmsg's): if it is a reply, the call it
 * answers fails rather than waiting for ever. */
static void fail_bad_reply(struct sw_conn *c, const uint8_t *buf, ssize_t n, int flags)
{
	if (n < SW_MSG_HEADER_LEN)
		return;
	uint16_t op = (uint16_t)(buf[4] | buf[5] << 8);
	struct sw_call *call = op & SW_REPLY_BIT ? take_call(c, get_le32(buf + 8)) : NULL;
	if (!call)
		return;
	call->r->st = SW_ST_BAD_MESSAGE;
	snprintf(call->r->msg, sizeof(call->r->msg), "%s",
		 (flags & MSG_CTRUNC)
			 ? "reply's descriptors lost (control data truncated: the process may be at its open-file limit, RLIMIT_NOFILE)"
			 : "malformed reply");
	call->r->blen = 0;
	call->r->nfds = 0;
	finish_call(c, call);
}

/* dispatch hands a well-formed message of n bytes in buf, with the nfds
 * descriptors fds, to its reader: an event to on_event (events carry no
 * descriptors), a reply to the call waiting for it. A reply nobody waits
 * for, or a request (the daemon sends none), is dropped with its
 * descriptors. */
static void dispatch(struct sw_conn *c, const uint8_t *buf, size_t n, int *fds, int nfds)
{
	uint16_t op = (uint16_t)(buf[4] | buf[5] << 8);
	const uint8_t *body = buf + SW_MSG_HEADER_LEN;
	size_t blen = n - SW_MSG_HEADER_LEN;
	if (op == SW_OP_EVENT) {
		close_all(fds, nfds);
		if (c->on_event)
			c->on_event(c, body, blen);
		return;
	}
	struct sw_call *call = take_call(c, get_le32(buf + 8));
	if (!call || !(op & SW_REPLY_BIT)) {
		close_all(fds, nfds);
		return;
	}
	fill_reply(call->r, body, blen, fds, nfds);
	finish_call(c, call);
}

/* fail_pending marks c gone (for the reason why, unless one is set
 * already) and fails every call still waiting for a reply. */
static void fail_pending(struct sw_conn *c, const char *why)
{
	pthread_mutex_lock(&c->mu);
	c->gone = 1;
	if (!c->reason[0])
		snprintf(c->reason, sizeof(c->reason), "%s", why);
	struct sw_call *calls = c->calls;
	c->calls = NULL;
	pthread_mutex_unlock(&c->mu);
	while (calls) {
		struct sw_call *next = calls->next;
		calls->r->st = SW_ST_REMOVED;
		snprintf(calls->r->msg, sizeof(calls->r->msg), "%s", c->reason);
		calls->r->blen = 0;
		calls->r->nfds = 0;
		finish_call(c, calls);
		calls = next;
	}
}

/* reader is the session's reader thread: it receives each message with
 * its descriptors and hands it on, until the daemon closes the socket (or
 * we do: sw_conn_close shuts it down), then fails what is still pending. */
static void *reader(void *arg)
{
	struct sw_conn *c = arg;
	static __thread uint8_t buf[SW_MAX_MSG + 1];
	char cbuf[CMSG_SPACE(sizeof(int) * (SW_MAX_FDS + 1))];
	const char *why = "verbs socket closed by the daemon";
	for (;;) {
		struct iovec iov = {buf, sizeof(buf)};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
		ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			/* (A failed recvmsg passes no descriptors and leaves
			 * the control buffer unwritten.) */
			why = strerror(errno);
			break;
		}
		int fds[SW_MAX_FDS + 1];
		int nfds = take_fds(&mh, fds);
		if (n == 0) {
			close_all(fds, nfds);
			break;
		}
		if (n < SW_MSG_HEADER_LEN || get_le32(buf) != (uint32_t)n || n > SW_MAX_MSG || nfds > SW_MAX_FDS ||
		    (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
			close_all(fds, nfds);
			fail_bad_reply(c, buf, n, mh.msg_flags);
			continue;
		}
		dispatch(c, buf, (size_t)n, fds, nfds);
	}
	/* The daemon is gone (or we closed): fail every pending call. */
	fail_pending(c, why);
	if (c->on_gone)
		c->on_gone(c);
	return NULL;
}

int sw_conn_start(struct sw_conn *c)
{
	int e = pthread_create(&c->reader, NULL, reader, c);
	if (e == 0)
		c->reader_started = 1;
	return e;
}

void sw_conn_close(struct sw_conn *c)
{
	if (!c)
		return;
	c->on_gone = NULL;
	c->on_event = NULL;
	shutdown(c->fd, SHUT_RDWR);
	if (c->reader_started)
		pthread_join(c->reader, NULL);
	close(c->fd);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->wmu);
	free(c);
}

static int send_msg(struct sw_conn *c, struct sw_enc *e, const int *fds, int nfds)
{
	char cbuf[CMSG_SPACE(sizeof(int) * SW_MAX_FDS)];
	struct iovec iov = {e->b, e->n};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds > 0) {
		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	}
	pthread_mutex_lock(&c->wmu);
	ssize_t n;
	do
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	int err = n < 0 ? errno : 0;
	pthread_mutex_unlock(&c->wmu);
	return err;
}

static int start_call(struct sw_conn *c, uint16_t op, struct sw_enc *e, const int *fds, int nfds, struct sw_call *call,
		      uint32_t *seqout)
{
	if (e->err)
		return EINVAL;
	pthread_mutex_lock(&c->mu);
	if (c->gone) {
		pthread_mutex_unlock(&c->mu);
		return ENODEV;
	}
	call->seq = ++c->seq;
	if (seqout)
		*seqout = call->seq;
	call->next = c->calls;
	c->calls = call;
	pthread_mutex_unlock(&c->mu);
	/* The body was encoded after a placeholder header: set op and seq. */
	e->b[4] = (uint8_t)op;
	e->b[5] = (uint8_t)(op >> 8);
	for (int i = 0; i < 4; i++)
		e->b[8 + i] = (uint8_t)(call->seq >> (8 * i));
	sw_enc_finish(e, nfds);
	int err = send_msg(c, e, fds, nfds);
	if (err) {
		pthread_mutex_lock(&c->mu);
		for (struct sw_call **pp = &c->calls; *pp; pp = &(*pp)->next) {
			if (*pp == call) {
				*pp = call->next;
				pthread_mutex_unlock(&c->mu);
				return c->gone ? ENODEV : err;
			}
		}
		/* The reader already failed it (daemon gone): it owns it now. */
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	return 0;
}

int sw_call(struct sw_conn *c, uint16_t op, struct sw_enc *e, const int *fds, int nfds, struct sw_reply *r)
{
	struct sw_call call = {.r = r};
	int err = start_call(c, op, e, fds, nfds, &call, NULL);
	if (err > 0)
		return err;
	pthread_mutex_lock(&c->mu);
	while (!call.done)
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	if (r->st == SW_ST_REMOVED && c->gone)
		return ENODEV;
	return 0;
}

int sw_call_async(struct sw_conn *c, uint16_t op, struct sw_enc *e, sw_async_cb cb, void *arg, uint32_t *seq)
{
	struct sw_call *call = calloc(1, sizeof(*call));
	struct sw_reply *r = malloc(sizeof(*r));
	if (!call || !r) {
		free(call);
		free(r);
		return ENOMEM;
	}
	call->r = r;
	call->cb = cb;
	call->arg = arg;
	int err = start_call(c, op, e, NULL, 0, call, seq);
	if (err > 0) {
		free(r);
		free(call);
		return err;
	}
	return 0; /* (-1: the reader already completed it) */
}

void sw_cancel(struct sw_conn *c, uint32_t seq)
{
	struct sw_enc e;
	sw_enc_begin(&e, SW_OP_CANCEL, 0);
	sw_enc_u32(&e, seq);
	sw_enc_finish(&e, 0);
	send_msg(c, &e, NULL, 0);
}

int sw_status_errno(const struct sw_reply *r)
{
	switch (r->st) {
	case SW_ST_OK:
		return 0;
	case SW_ST_ERROR:
		if (r->blen >= 6 && r->body[0] == 4 && r->body[1] == 0) {
			/* Bytes(errno, big-endian) */
			int e = (int)((uint32_t)r->body[2] << 24 | (uint32_t)r->body[3] << 16 | (uint32_t)r->body[4] << 8 | r->body[5]);
			if (e > 0)
				return e;
		}
		return EINVAL;
	case SW_ST_BAD_MESSAGE:
	case SW_ST_UNKNOWN_OP:
	case SW_ST_BAD_HANDLE:
	case SW_ST_FOREIGN:
	case SW_ST_QP_STATE:
		return EINVAL;
	case SW_ST_BUSY:
		return EBUSY;
	case SW_ST_REJECTED:
		return ECONNREFUSED;
	case SW_ST_CANCELED:
		return ECANCELED;
	case SW_ST_REMOVED:
		return ENODEV;
	case SW_ST_NOT_SUPPORTED:
		return EOPNOTSUPP;
	case SW_ST_LIMIT:
		/* A per-client limit of the daemon (siwtun up --max-client-*):
		 * what a kernel provider answers when a device limit or
		 * RLIMIT_MEMLOCK is reached. */
		return ENOMEM;
	}
	return EIO;
}
