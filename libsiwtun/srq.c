/* Shared receive queues: ibv_create_srq, ibv_modify_srq, ibv_query_srq,
 * ibv_destroy_srq and ibv_post_srq_recv (the context's post_srq_recv op,
 * which rdma-core's inline calls). The receives go into a ring shared with
 * the daemon, as a QP's do; the ring has no doorbell: the daemon reads it
 * when a Send on one of the SRQ's QPs needs a receive (see uabi's
 * CreateSRQReply). verbs/remote_srq.go is the Go client of the same
 * protocol. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sw.h"

static inline uint32_t ld32(const uint8_t *p) { return __atomic_load_n((const uint32_t *)p, __ATOMIC_SEQ_CST); }
static inline void st32(uint8_t *p, uint32_t v) { __atomic_store_n((uint32_t *)p, v, __ATOMIC_SEQ_CST); }
static inline void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* Maps the ring memfd fd (closing it) of count entries in size bytes. */
static int map_ring(int fd, uint32_t count, uint32_t size, uint8_t **mem)
{
	uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return errno;
	int err = sw_check_ring(m, size, count, SW_RQE_SIZE);
	if (err) {
		munmap(m, size);
		return err;
	}
	*mem = m;
	return 0;
}

/* A call on SRQ h with no body in the request but the handle. */
static int ref_call(struct sw_context *ctx, uint16_t op, uint32_t h, struct sw_reply *r)
{
	struct sw_enc e;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, h);
	int err = sw_call(ctx->conn, op, &e, NULL, 0, r);
	if (err)
		return err;
	if ((err = sw_status_errno(r)))
		sw_close_fds(r);
	return err;
}

SW_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct sw_context *ctx = to_ctx(pd->context);
	struct sw_device *d = ctx->dev;
	if (!attr || attr->attr.max_wr == 0 || attr->attr.max_wr > d->attr[SW_A_MAX_SRQ_WR] ||
	    attr->attr.max_sge > d->attr[SW_A_MAX_SRQ_SGE] || attr->attr.srq_limit > attr->attr.max_wr) {
		errno = EINVAL;
		return NULL;
	}
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, ((struct sw_pd *)pd)->h);
	sw_enc_u32(&e, attr->attr.max_wr);
	sw_enc_u32(&e, attr->attr.srq_limit);
	int err = sw_call(ctx->conn, SW_OP_CREATE_SRQ, &e, NULL, 0, &r);
	if (!err && (err = sw_status_errno(&r)))
		sw_close_fds(&r);
	if (err) {
		errno = err;
		return NULL;
	}
	struct sw_dec dd = {r.body, r.blen, 0};
	uint32_t h = sw_dec_u32(&dd), count = sw_dec_u32(&dd), size = sw_dec_u32(&dd);
	struct sw_srq *s = NULL;
	if (dd.err || r.nfds != 1) {
		sw_close_fds(&r);
		err = EPROTO;
	} else if (!(s = calloc(1, sizeof(*s)))) {
		sw_close_fds(&r);
		err = ENOMEM;
	} else {
		err = map_ring(r.fds[0], count, size, &s->mem);
	}
	if (err) {
		free(s);
		struct sw_reply rr;
		if (!ref_call(ctx, SW_OP_DESTROY_SRQ, h, &rr))
			sw_close_fds(&rr);
		errno = err;
		return NULL;
	}
	s->h = h;
	s->memlen = size;
	s->count = count;
	s->max_wr = attr->attr.max_wr;
	pthread_mutex_init(&s->lock, NULL);
	s->srq.context = pd->context;
	s->srq.srq_context = attr->srq_context;
	s->srq.pd = pd;
	s->srq.handle = h;
	pthread_mutex_init(&s->srq.mutex, NULL);
	pthread_cond_init(&s->srq.cond, NULL);
	attr->attr.max_sge = d->attr[SW_A_MAX_SRQ_SGE];
	pthread_mutex_lock(&ctx->mu);
	s->next = ctx->srqs;
	ctx->srqs = s;
	pthread_mutex_unlock(&ctx->mu);
	return &s->srq;
}

SW_EXPORT int ibv_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct sw_srq *s = (struct sw_srq *)ibsrq;
	struct sw_context *ctx = to_ctx(ibsrq->context);
	if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		return EINVAL;
	if ((mask & IBV_SRQ_MAX_WR) && (attr->max_wr == 0 || attr->max_wr > ctx->dev->attr[SW_A_MAX_SRQ_WR]))
		return EINVAL;
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, s->h);
	sw_enc_u32(&e, (uint32_t)mask);
	sw_enc_u32(&e, (mask & IBV_SRQ_MAX_WR) ? attr->max_wr : 0);
	sw_enc_u32(&e, (mask & IBV_SRQ_LIMIT) ? attr->srq_limit : 0);
	/* No posts while the daemon may replace the ring. */
	pthread_mutex_lock(&s->lock);
	int err = sw_call(ctx->conn, SW_OP_MODIFY_SRQ, &e, NULL, 0, &r);
	if (!err && (err = sw_status_errno(&r)))
		sw_close_fds(&r);
	if (!err) {
		struct sw_dec d = {r.body, r.blen, 0};
		uint8_t fresh = sw_dec_u8(&d);
		uint32_t count = sw_dec_u32(&d), size = sw_dec_u32(&d);
		if (d.err || r.nfds != 1) {
			sw_close_fds(&r);
			err = EPROTO;
		} else if (fresh) {
			uint8_t *mem;
			err = map_ring(r.fds[0], count, size, &mem);
			if (!err) {
				munmap(s->mem, s->memlen);
				s->mem = mem;
				s->memlen = size;
				s->count = count;
				s->prod = 0;
			}
		} else {
			sw_close_fds(&r);
		}
	}
	if (!err && (mask & IBV_SRQ_MAX_WR))
		s->max_wr = attr->max_wr;
	pthread_mutex_unlock(&s->lock);
	return err;
}

SW_EXPORT int ibv_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct sw_srq *s = (struct sw_srq *)ibsrq;
	struct sw_reply r;
	int err = ref_call(to_ctx(ibsrq->context), SW_OP_QUERY_SRQ, s->h, &r);
	if (err)
		return err;
	sw_close_fds(&r);
	struct sw_dec d = {r.body, r.blen, 0};
	attr->max_wr = sw_dec_u32(&d);
	attr->max_sge = sw_dec_u32(&d);
	attr->srq_limit = sw_dec_u32(&d);
	return d.err ? EPROTO : 0;
}

SW_EXPORT int ibv_destroy_srq(struct ibv_srq *ibsrq)
{
	struct sw_srq *s = (struct sw_srq *)ibsrq;
	struct sw_context *ctx = to_ctx(ibsrq->context);
	struct sw_reply r;
	int err = ref_call(ctx, SW_OP_DESTROY_SRQ, s->h, &r);
	if (err && err != ENODEV)
		return err; /* EBUSY: QPs still use it */
	if (!err)
		sw_close_fds(&r);
	pthread_mutex_lock(&ctx->mu);
	SW_UNLINK(&ctx->srqs, s);
	pthread_mutex_unlock(&ctx->mu);
	munmap(s->mem, s->memlen);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->srq.mutex);
	pthread_cond_destroy(&s->srq.cond);
	free(s);
	return 0;
}

int sw_ctx_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct sw_srq *s = (struct sw_srq *)ibsrq;
	int err = 0;
	pthread_mutex_lock(&s->lock);
	if (atomic_load(&to_ctx(ibsrq->context)->removed))
		err = ENODEV;
	for (; !err && wr; wr = wr->next) {
		if (wr->num_sge > SW_MAX_SGE || wr->num_sge < 0) {
			err = EINVAL;
			break;
		}
		uint8_t *e = s->mem + SW_RING_HEADER_SIZE + (size_t)(s->prod & (s->count - 1)) * SW_RQE_SIZE;
		/* At most max_wr posted and not completed (the daemon's SRQ
		 * holds no more); the ring, at least as deep, then has room. */
		if (s->posted - atomic_load(&s->done) >= s->max_wr || (ld32(e) != 0 && sw_wait_free(e))) {
			err = ENOMEM;
			break;
		}
		e[SW_RQE_NSGE] = (uint8_t)wr->num_sge;
		put64(e + SW_RQE_ID, wr->wr_id);
		sw_put_sgl(e + SW_RQE_SGL, wr->sg_list, wr->num_sge);
		st32(e, SW_OWNER_VALID);
		s->prod++;
		s->posted++;
	}
	pthread_mutex_unlock(&s->lock);
	if (err)
		*bad = wr;
	return err;
}

void sw_srq_event(struct sw_context *ctx, uint32_t h, uint32_t type)
{
	pthread_mutex_lock(&ctx->mu);
	struct sw_srq *s = ctx->srqs;
	while (s && s->h != h)
		s = s->next;
	pthread_mutex_unlock(&ctx->mu);
	if (s && type == SW_SRQEV_LIMIT_REACHED)
		sw_async_push(ctx, IBV_EVENT_SRQ_LIMIT_REACHED, &s->srq);
}
