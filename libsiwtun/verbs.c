/* Verbs over the verbs socket and the shared rings: PD, MR, completion
 * channels, CQ, QP, post and poll (verbs/remote.go and remote_rings.go are
 * the Go client of the same protocol). */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "sw.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

static inline uint32_t ld32(const uint8_t *p) { return __atomic_load_n((const uint32_t *)p, __ATOMIC_SEQ_CST); }
static inline void st32(uint8_t *p, uint32_t v) { __atomic_store_n((uint32_t *)p, v, __ATOMIC_SEQ_CST); }

static inline void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t get32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}
static inline uint64_t get64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

static void *fail_null(int err)
{
	errno = err;
	return NULL;
}

/* A call whose reply carries no body: 0 or an errno. */
static int simple_call(struct sw_context *ctx, uint16_t op, uint32_t h)
{
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, h);
	int err = sw_call(ctx->conn, op, &e, NULL, 0, &r);
	if (err)
		return err;
	sw_close_fds(&r);
	return sw_status_errno(&r);
}

/* Destroys the daemon's object h with op; a daemon that is gone (ENODEV)
 * took its objects with it, so that counts as done. */
static int destroy_call(struct sw_context *ctx, uint16_t op, uint32_t h)
{
	int err = simple_call(ctx, op, h);
	return err == ENODEV ? 0 : err;
}

/* Sends a create request: 0 with the reply in r (its fds to take), or an
 * errno with nothing left open. */
static int create_call(struct sw_context *ctx, uint16_t op, struct sw_enc *e, struct sw_reply *r)
{
	int err = sw_call(ctx->conn, op, e, NULL, 0, r);
	if (!err && (err = sw_status_errno(r)))
		sw_close_fds(r);
	return err;
}

/* Undoes a create whose reply came but whose object cannot be used: unmaps
 * its ring memory (len bytes at mem, unless MAP_FAILED), closes its
 * notification fd, destroys it at the daemon with destroy_op and fails
 * with err (ENOMEM for 0). */
static void *undo_create(struct sw_context *ctx, uint16_t destroy_op, uint32_t h, uint8_t *mem, size_t len, int fd,
			 int err)
{
	if (mem != MAP_FAILED)
		munmap(mem, len);
	close(fd);
	simple_call(ctx, destroy_op, h);
	return fail_null(err ? err : ENOMEM);
}

/* Maps a ring memfd the daemon sent and checks one ring header. */
int sw_check_ring(const uint8_t *mem, size_t len, uint32_t count, uint32_t esz)
{
	if (len < SW_RING_HEADER_SIZE || ld32(mem + SW_RING_HDR_MAGIC) != SW_RING_MAGIC ||
	    get32(mem + SW_RING_HDR_ENTRY_SIZE) != esz || get32(mem + SW_RING_HDR_COUNT) != count || count == 0 ||
	    (count & (count - 1)) || SW_RING_HEADER_SIZE + (size_t)count * esz > len)
		return EPROTO;
	return 0;
}

/* ---- PD ---- */

SW_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct sw_context *ctx = to_ctx(context);
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	int err = sw_call(ctx->conn, SW_OP_ALLOC_PD, &e, NULL, 0, &r);
	if (err)
		return fail_null(err);
	sw_close_fds(&r);
	if ((err = sw_status_errno(&r)))
		return fail_null(err == EINVAL ? ENOMEM : err);
	struct sw_dec d = {r.body, r.blen, 0};
	struct sw_pd *pd = calloc(1, sizeof(*pd));
	if (!pd)
		return fail_null(ENOMEM);
	pd->h = sw_dec_u32(&d);
	pd->pd.handle = sw_dec_u32(&d);
	pd->pd.context = context;
	return &pd->pd;
}

/* Destroys h and frees obj, a PD or an MR (they hold nothing else). */
static int destroy_free(struct ibv_context *context, uint16_t op, uint32_t h, void *obj)
{
	int err = destroy_call(to_ctx(context), op, h);
	if (!err)
		free(obj);
	return err;
}

SW_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	return destroy_free(pd->context, SW_OP_DEALLOC_PD, ((struct sw_pd *)pd)->h, pd);
}

/* ---- MR ---- */

int sw_mr_access(unsigned int access)
{
	/* Optional bits are ignored when unsupported (rdma-core's rule).
	 * REMOTE_ATOMIC lets the peer's RFC 7306 atomics operate on the
	 * region, MW_BIND lets memory windows be bound to it. */
	access &= ~(unsigned int)IBV_ACCESS_OPTIONAL_RANGE;
	if (access & ~(unsigned int)(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND)) {
		errno = EOPNOTSUPP;
		return -1;
	}
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return -1;
	}
	return (int)access;
}

static struct ibv_mr *reg_mr(struct ibv_pd *ibpd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	struct sw_pd *pd = (struct sw_pd *)ibpd;
	int acc = sw_mr_access(access);
	if (acc < 0)
		return NULL;
	access = (unsigned int)acc;
	if (!addr || !length)
		return fail_null(EINVAL);
	int fd;
	int err = sw_mem_share(addr, length, &fd);
	if (err)
		return fail_null(err);
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, pd->h);
	sw_enc_u64(&e, (uint64_t)(uintptr_t)addr); /* the file offset is the address */
	sw_enc_u64(&e, length);
	sw_enc_u64(&e, iova);
	sw_enc_u32(&e, access);
	err = sw_call(to_ctx(ibpd->context)->conn, SW_OP_REG_MR, &e, &fd, 1, &r);
	if (err)
		return fail_null(err);
	sw_close_fds(&r);
	if ((err = sw_status_errno(&r)))
		return fail_null(err);
	struct sw_dec d = {r.body, r.blen, 0};
	struct sw_mr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return fail_null(ENOMEM);
	mr->h = sw_dec_u32(&d);
	mr->mr.lkey = mr->mr.rkey = sw_dec_u32(&d);
	mr->mr.handle = mr->h;
	mr->mr.context = ibpd->context;
	mr->mr.pd = ibpd;
	mr->mr.addr = addr;
	mr->mr.length = length;
	mr->iova = iova;
	mr->access = access;
	return &mr->mr;
}

SW_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return reg_mr(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

SW_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	return reg_mr(pd, addr, length, iova, (unsigned int)access);
}

SW_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	return reg_mr(pd, addr, length, iova, access);
}

SW_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	return destroy_free(mr->context, SW_OP_DEREG_MR, ((struct sw_mr *)mr)->h, mr);
}

/* ---- completion channels ---- */

/* A channel's fd is an epoll set of its CQs' notification eventfds:
 * pollable, and readable when any of them fired. */
SW_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct ibv_comp_channel *ch = calloc(1, sizeof(*ch));
	if (!ch)
		return fail_null(ENOMEM);
	ch->fd = epoll_create1(EPOLL_CLOEXEC);
	if (ch->fd < 0) {
		int e = errno;
		free(ch);
		return fail_null(e);
	}
	ch->context = context;
	return ch;
}

SW_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	if (__atomic_load_n(&ch->refcnt, __ATOMIC_SEQ_CST)) {
		errno = EBUSY;
		return EBUSY;
	}
	close(ch->fd);
	free(ch);
	return 0;
}

SW_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	int fl = fcntl(ch->fd, F_GETFL);
	struct epoll_event ev;
	int n = epoll_wait(ch->fd, &ev, 1, fl >= 0 && (fl & O_NONBLOCK) ? 0 : -1);
	if (n < 0)
		return -1;
	if (n == 0) {
		errno = EAGAIN;
		return -1;
	}
	struct sw_cq *c = ev.data.ptr;
	uint64_t v;
	if (read(c->nfd, &v, sizeof(v)) < 0) {
		/* already cleared by another waiter: still an event */
	}
	*cq = &c->cq;
	*cq_context = c->cq.cq_context;
	return 0;
}

SW_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* ---- CQ ---- */

SW_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				       struct ibv_comp_channel *channel, int comp_vector)
{
	struct sw_context *ctx = to_ctx(context);
	if (cqe <= 0 || cqe > (int)ctx->dev->attr[SW_A_MAX_CQE] || comp_vector != 0)
		return fail_null(EINVAL);
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, (uint32_t)cqe);
	int err = create_call(ctx, SW_OP_CREATE_CQ, &e, &r);
	if (err)
		return fail_null(err);
	struct sw_dec d = {r.body, r.blen, 0};
	uint32_t h = sw_dec_u32(&d), count = sw_dec_u32(&d), size = sw_dec_u32(&d);
	if (d.err || r.nfds != 2) {
		sw_close_fds(&r);
		simple_call(ctx, SW_OP_DESTROY_CQ, h);
		return fail_null(EPROTO);
	}
	uint8_t *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, r.fds[0], 0);
	close(r.fds[0]);
	err = mem == MAP_FAILED ? errno : sw_check_ring(mem, size, count, SW_CQE_SIZE);
	struct sw_cq *cq = err ? NULL : calloc(1, sizeof(*cq));
	if (!cq)
		return undo_create(ctx, SW_OP_DESTROY_CQ, h, mem, size, r.fds[1], err);
	cq->h = h;
	cq->mem = mem;
	cq->memlen = size;
	cq->count = count;
	cq->nfd = r.fds[1];
	pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	cq->cq.context = context;
	cq->cq.channel = channel;
	cq->cq.cq_context = cq_context;
	cq->cq.handle = h;
	cq->cq.cqe = cqe;
	pthread_mutex_init(&cq->cq.mutex, NULL);
	pthread_cond_init(&cq->cq.cond, NULL);
	if (channel) {
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = cq};
		if (epoll_ctl(channel->fd, EPOLL_CTL_ADD, cq->nfd, &ev) < 0) {
			err = errno;
			free(cq);
			return undo_create(ctx, SW_OP_DESTROY_CQ, h, mem, size, r.fds[1], err);
		}
		__atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_SEQ_CST);
	}
	pthread_mutex_lock(&ctx->mu);
	cq->next = ctx->cqs;
	ctx->cqs = cq;
	pthread_mutex_unlock(&ctx->mu);
	return &cq->cq;
}

SW_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct sw_cq *cq = (struct sw_cq *)ibcq;
	struct sw_context *ctx = to_ctx(ibcq->context);
	int err = destroy_call(ctx, SW_OP_DESTROY_CQ, cq->h);
	if (err)
		return err;
	pthread_mutex_lock(&ctx->mu);
	SW_UNLINK(&ctx->cqs, cq);
	pthread_mutex_unlock(&ctx->mu);
	if (ibcq->channel) {
		epoll_ctl(ibcq->channel->fd, EPOLL_CTL_DEL, cq->nfd, NULL);
		__atomic_sub_fetch(&ibcq->channel->refcnt, 1, __ATOMIC_SEQ_CST);
	}
	munmap(cq->mem, cq->memlen);
	close(cq->nfd);
	pthread_spin_destroy(&cq->lock);
	free(cq);
	return 0;
}

SW_EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	(void)cq;
	(void)cqe;
	return EOPNOTSUPP;
}

int sw_ctx_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct sw_cq *cq = (struct sw_cq *)ibcq;
	st32(cq->mem + SW_RING_HDR_NOTIFY, solicited_only ? SW_NOTIFY_SOLICITED : SW_NOTIFY_NEXT);
	if (atomic_load(&to_ctx(ibcq->context)->removed)) {
		uint64_t one = 1;
		if (write(cq->nfd, &one, sizeof(one)) < 0) {
			/* saturated */
		}
	}
	return 0;
}

/* The completion opcode of a send request with opcode op. */
static enum ibv_wc_opcode wc_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return IBV_WC_FETCH_ADD;
	case IBV_WR_BIND_MW:
		return IBV_WC_BIND_MW;
	case IBV_WR_LOCAL_INV:
		return IBV_WC_LOCAL_INV;
	default:
		return IBV_WC_SEND;
	}
}

/* Retires the shadow entries a completion accounts for. */
static void retire(struct sw_context *ctx, const struct ibv_wc *wc)
{
	pthread_mutex_lock(&ctx->mu);
	struct sw_qp *q = ctx->qps;
	while (q && q->qp.qp_num != wc->qp_num)
		q = q->next;
	if (q) {
		if ((wc->opcode & IBV_WC_RECV) && q->srq) {
			atomic_fetch_add(&q->srq->done, 1); /* one of the SRQ's receives */
		} else if (wc->opcode & IBV_WC_RECV) {
			pthread_spin_lock(&q->rlock);
			if (q->r_head < q->r_tail)
				q->r_head++;
			pthread_spin_unlock(&q->rlock);
		} else {
			/* Send requests complete in order, so this completion
			 * retires its request and every one before it. Which
			 * one it is: the first with its wr_id that completes
			 * this way: a success completes only a signaled
			 * request (an application may give every request the
			 * same wr_id, as perftest does, and signal one in
			 * 100); an error completes any. */
			pthread_spin_lock(&q->slock);
			int ok = wc->status == IBV_WC_SUCCESS;
			for (uint64_t p = q->s_head; p < q->s_tail; p++) {
				const struct sw_shadow *s = &q->sent[p % q->nsent];
				if (s->id == wc->wr_id && (s->signaled || !ok)) {
					q->s_head = p + 1;
					break;
				}
			}
			pthread_spin_unlock(&q->slock);
		}
	}
	pthread_mutex_unlock(&ctx->mu);
}

/* After the daemon went: what it never completed completes flushed. */
static int flush(struct sw_context *ctx, struct sw_cq *cq, int n, struct ibv_wc *wc)
{
	int k = 0;
	pthread_mutex_lock(&ctx->mu);
	for (struct sw_qp *q = ctx->qps; q && k < n; q = q->next) {
		if (q->qp.send_cq == &cq->cq) {
			pthread_spin_lock(&q->slock);
			for (; k < n && q->s_head < q->s_tail; q->s_head++, k++) {
				struct sw_shadow *s = &q->sent[q->s_head % q->nsent];
				memset(&wc[k], 0, sizeof(wc[k]));
				wc[k].wr_id = s->id;
				wc[k].status = IBV_WC_WR_FLUSH_ERR;
				wc[k].opcode = wc_opcode(s->op);
				wc[k].qp_num = q->qp.qp_num;
			}
			pthread_spin_unlock(&q->slock);
		}
		if (q->qp.recv_cq == &cq->cq) {
			pthread_spin_lock(&q->rlock);
			for (; k < n && q->r_head < q->r_tail; q->r_head++, k++) {
				memset(&wc[k], 0, sizeof(wc[k]));
				wc[k].wr_id = q->recvd[q->r_head % q->nrecvd];
				wc[k].status = IBV_WC_WR_FLUSH_ERR;
				wc[k].opcode = IBV_WC_RECV;
				wc[k].qp_num = q->qp.qp_num;
			}
			pthread_spin_unlock(&q->rlock);
		}
	}
	pthread_mutex_unlock(&ctx->mu);
	return k;
}

int sw_ctx_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct sw_cq *cq = (struct sw_cq *)ibcq;
	struct sw_context *ctx = to_ctx(ibcq->context);
	int k = 0;
	pthread_spin_lock(&cq->lock);
	while (k < n) {
		uint8_t *e = cq->mem + SW_RING_HEADER_SIZE + (size_t)(cq->cons & (cq->count - 1)) * SW_CQE_SIZE;
		if (!(ld32(e) & SW_OWNER_VALID))
			break;
		struct ibv_wc *w = &wc[k];
		memset(w, 0, sizeof(*w));
		w->wr_id = get64(e + SW_CQE_ID);
		w->status = get32(e + SW_CQE_STATUS);
		w->opcode = get32(e + SW_CQE_OPCODE);
		w->vendor_err = get32(e + SW_CQE_VENDOR_ERR);
		w->byte_len = get32(e + SW_CQE_BYTE_LEN);
		w->qp_num = get32(e + SW_CQE_QP_NUM);
		w->wc_flags = get32(e + SW_CQE_FLAGS);
		if (w->wc_flags & IBV_WC_WITH_IMM)
			w->imm_data = htobe32(get32(e + SW_CQE_IMM_DATA)); /* network order, as libibverbs has it */
		else
			w->invalidated_rkey = get32(e + SW_CQE_INV_RKEY);
		st32(e, 0);
		cq->cons++;
		k++;
	}
	int over = k == 0 && ld32(cq->mem + SW_RING_HDR_OVERFLOW) && !cq->overflowed;
	if (over)
		cq->overflowed = 1;
	pthread_spin_unlock(&cq->lock);
	for (int i = 0; i < k; i++)
		retire(ctx, &wc[i]);
	if (over)
		sw_async_push(ctx, IBV_EVENT_CQ_ERR, ibcq);
	if (k == 0 && atomic_load(&ctx->removed))
		k = flush(ctx, cq, n, wc);
	/* A program spinning on an empty CQ (perftest's latency tests) would
	 * take the processor from the daemon that must produce the
	 * completion: after a few empty polls in a row, each one yields it. */
	if (k == 0) {
		if (++cq->empty > 16)
			sched_yield();
	} else {
		cq->empty = 0;
	}
	return k;
}

/* ---- QP ---- */

int sw_qp_modify_state(struct sw_qp *q, enum ibv_qp_state s);

/* check_qp_attr: whether this RNIC makes the QP attr asks for in ibpd: an
 * RC QP whose CQs (and SRQ) belong to ibpd's context, its queues within
 * the device's limits. */
static int check_qp_attr(const struct ibv_pd *ibpd, const struct ibv_qp_init_attr *attr)
{
	const struct ibv_qp_cap *cap = &attr->cap;
	if (attr->qp_type != IBV_QPT_RC)
		return EOPNOTSUPP;
	if (!attr->send_cq || !attr->recv_cq || attr->send_cq->context != ibpd->context ||
	    attr->recv_cq->context != ibpd->context || (attr->srq && attr->srq->context != ibpd->context))
		return EINVAL;
	if (cap->max_send_wr > SW_MAX_QP_WR || cap->max_recv_wr > SW_MAX_QP_WR || cap->max_send_sge > SW_MAX_SGE ||
	    cap->max_recv_sge > SW_MAX_SGE || cap->max_inline_data > SW_MAX_INLINE)
		return EINVAL;
	return 0;
}

/* The daemon's answer to CREATE_QP: the QP's handle and number, the entry
 * counts of its send and receive rings, where the receive ring starts in
 * the memory both share and that memory's length. The memory's memfd and
 * the doorbell's eventfd come with it. */
struct qp_created {
	uint32_t h, num, sqc, rqc, sqb, total;
};

/* ask_create_qp asks the daemon for the QP attr describes, with ms send
 * and mr receive entries, and fills qc and r (its two descriptors) from
 * the answer. A reply it does not understand is EPROTO, the QP destroyed. */
static int ask_create_qp(struct sw_context *ctx, struct ibv_pd *ibpd, const struct ibv_qp_init_attr *attr,
			 uint32_t ms, uint32_t mr, struct qp_created *qc, struct sw_reply *r)
{
	struct sw_srq *srq = (struct sw_srq *)attr->srq;
	struct sw_enc e;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, ((struct sw_pd *)ibpd)->h);
	sw_enc_u32(&e, ((struct sw_cq *)attr->send_cq)->h);
	sw_enc_u32(&e, ((struct sw_cq *)attr->recv_cq)->h);
	sw_enc_u32(&e, ms);
	sw_enc_u32(&e, mr);
	sw_enc_u8(&e, attr->sq_sig_all ? 1 : 0);
	sw_enc_u32(&e, srq ? srq->h : 0);
	int err = create_call(ctx, SW_OP_CREATE_QP, &e, r);
	if (err)
		return err;
	struct sw_dec d = {r->body, r->blen, 0};
	qc->h = sw_dec_u32(&d);
	qc->num = sw_dec_u32(&d);
	qc->sqc = sw_dec_u32(&d);
	qc->rqc = sw_dec_u32(&d);
	qc->sqb = sw_dec_u32(&d);
	qc->total = sw_dec_u32(&d);
	if (d.err || r->nfds != 2 || qc->sqb > qc->total) {
		sw_close_fds(r);
		simple_call(ctx, SW_OP_DESTROY_QP, qc->h);
		return EPROTO;
	}
	return 0;
}

/* make_qp_rings maps the rings' memory the daemon sent in r (closing its
 * memfd), checks both rings' headers, and allocates the QP with its shadow
 * rings (what was posted: ms sends, mr receives) and the doorbell. On
 * failure it unwinds (the memory unmapped, the doorbell closed, the QP
 * destroyed in the daemon) and returns NULL with errno set. */
static struct sw_qp *make_qp_rings(struct sw_context *ctx, const struct qp_created *qc, struct sw_reply *r,
				   uint32_t ms, uint32_t mr)
{
	uint8_t *mem = mmap(NULL, qc->total, PROT_READ | PROT_WRITE, MAP_SHARED, r->fds[0], 0);
	int err = mem == MAP_FAILED ? errno : 0;
	close(r->fds[0]);
	if (!err)
		err = sw_check_ring(mem, qc->sqb, qc->sqc, SW_SQE_SIZE);
	if (!err)
		err = sw_check_ring(mem + qc->sqb, qc->total - qc->sqb, qc->rqc, SW_RQE_SIZE);
	struct sw_qp *q = err ? NULL : calloc(1, sizeof(*q));
	if (q) {
		q->sent = calloc(ms, sizeof(*q->sent));
		q->recvd = calloc(mr, sizeof(*q->recvd));
		if (!q->sent || !q->recvd) {
			free(q->sent);
			free(q->recvd);
			free(q);
			q = NULL;
			err = ENOMEM;
		}
	}
	if (!q)
		return undo_create(ctx, SW_OP_DESTROY_QP, qc->h, mem, qc->total, r->fds[1], err);
	q->h = qc->h;
	q->mem = mem;
	q->memlen = qc->total;
	q->sq = mem;
	q->rq = mem + qc->sqb;
	q->sq_count = qc->sqc;
	q->rq_count = qc->rqc;
	q->doorbell = r->fds[1];
	q->nsent = ms;
	q->nrecvd = mr;
	return q;
}

/* init_qp fills in the rest of q and its ibv_qp (number num) from attr,
 * and attr's capabilities with what the QP has. */
static void init_qp(struct sw_qp *q, struct ibv_pd *ibpd, struct ibv_qp_init_attr *attr, uint32_t num)
{
	struct ibv_qp_cap *cap = &attr->cap;
	struct sw_srq *srq = (struct sw_srq *)attr->srq;
	q->sig_all = attr->sq_sig_all;
	pthread_spin_init(&q->slock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&q->rlock, PTHREAD_PROCESS_PRIVATE);
	cap->max_send_wr = q->nsent;
	cap->max_recv_wr = srq ? 0 : q->nrecvd;
	cap->max_send_sge = SW_MAX_SGE;
	cap->max_recv_sge = srq ? 0 : SW_MAX_SGE;
	q->srq = srq;
	cap->max_inline_data = SW_MAX_INLINE;
	q->cap = *cap;
	struct ibv_qp *qp = &q->qp;
	qp->context = ibpd->context;
	qp->qp_context = attr->qp_context;
	qp->pd = ibpd;
	qp->send_cq = attr->send_cq;
	qp->recv_cq = attr->recv_cq;
	qp->srq = attr->srq;
	qp->handle = q->h;
	qp->qp_num = num;
	qp->state = IBV_QPS_RESET;
	qp->qp_type = IBV_QPT_RC;
	pthread_mutex_init(&qp->mutex, NULL);
	pthread_cond_init(&qp->cond, NULL);
}

SW_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *ibpd, struct ibv_qp_init_attr *attr)
{
	if (!ibpd || !attr)
		return fail_null(EINVAL); /* (an rdma_cm id's PD before it has a device) */
	struct sw_context *ctx = to_ctx(ibpd->context);
	int err = check_qp_attr(ibpd, attr);
	if (err)
		return fail_null(err);
	/* A QP on an SRQ has no receive queue of its own (a one-entry ring
	 * the daemon never reads). */
	const struct ibv_qp_cap *cap = &attr->cap;
	uint32_t ms = cap->max_send_wr ? cap->max_send_wr : 1;
	uint32_t mr = attr->srq || !cap->max_recv_wr ? 1 : cap->max_recv_wr;
	struct qp_created qc;
	struct sw_reply r;
	if ((err = ask_create_qp(ctx, ibpd, attr, ms, mr, &qc, &r)))
		return fail_null(err);
	struct sw_qp *q = make_qp_rings(ctx, &qc, &r, ms, mr);
	if (!q)
		return NULL;
	init_qp(q, ibpd, attr, qc.num);
	pthread_mutex_lock(&ctx->mu);
	q->next = ctx->qps;
	ctx->qps = q;
	pthread_mutex_unlock(&ctx->mu);
	/* An iWARP QP starts ready for receives and for connection
	 * management: Linux siw's new QP is IDLE, which ibv_query_qp reports
	 * as INIT (rdma-core's tests expect INIT for an RNIC's new QP), while
	 * the ibv_qp's state field says RESET until a query or a modify, as
	 * libibverbs sets it at creation. */
	if ((err = sw_qp_modify_state(q, IBV_QPS_INIT))) {
		ibv_destroy_qp(&q->qp);
		return fail_null(err);
	}
	q->qp.state = IBV_QPS_RESET;
	return &q->qp;
}

/* verbs_context.create_qp_ex (ibv_create_qp_ex): an RC QP in a PD, with
 * no creation flags and no TSO (an iWARP QP has neither), as siw creates
 * it through libibverbs; the extended work request interface
 * (IBV_QP_INIT_ATTR_SEND_OPS_FLAGS), XRC and the rest are EOPNOTSUPP. */
struct ibv_qp *sw_ctx_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *a)
{
	uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || (a->comp_mask & ~known) ||
	    ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags) ||
	    ((a->comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER) && a->max_tso_header))
		return fail_null(EOPNOTSUPP);
	if (!a->pd || a->pd->context != context)
		return fail_null(EINVAL);
	struct ibv_qp_init_attr ia = {.qp_context = a->qp_context, .send_cq = a->send_cq, .recv_cq = a->recv_cq,
				      .srq = a->srq, .cap = a->cap, .qp_type = a->qp_type, .sq_sig_all = a->sq_sig_all};
	struct ibv_qp *qp = ibv_create_qp(a->pd, &ia);
	if (qp)
		a->cap = ia.cap;
	return qp;
}

SW_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct sw_qp *q = (struct sw_qp *)ibqp;
	struct sw_context *ctx = to_ctx(ibqp->context);
	int err = destroy_call(ctx, SW_OP_DESTROY_QP, q->h);
	if (err)
		return err;
	pthread_mutex_lock(&ctx->mu);
	SW_UNLINK(&ctx->qps, q);
	if (q->cm)
		sw_cm_qp_event(ctx, q, 0, 0, NULL, 0); /* detaches it from its id */
	pthread_mutex_unlock(&ctx->mu);
	munmap(q->mem, q->memlen);
	close(q->doorbell);
	free(q->sent);
	free(q->recvd);
	free(q);
	return 0;
}

/* sw_qp_modify_state asks the daemon for a state (RESET, INIT, ERR). */
int sw_qp_modify_state(struct sw_qp *q, enum ibv_qp_state s)
{
	struct sw_context *ctx = to_ctx(q->qp.context);
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, q->h);
	sw_enc_u32(&e, (uint32_t)s);
	int err = sw_call(ctx->conn, SW_OP_MODIFY_QP, &e, NULL, 0, &r);
	if (!err) {
		sw_close_fds(&r);
		err = sw_status_errno(&r);
	}
	if (err)
		return err;
	switch (s) {
	case IBV_QPS_INIT:
		atomic_store(&q->inited, 1);
		break;
	case IBV_QPS_RESET:
		atomic_store(&q->post_ok, 0);
		atomic_store(&q->inited, 0);
		pthread_spin_lock(&q->slock);
		q->s_head = q->s_tail;
		pthread_spin_unlock(&q->slock);
		pthread_spin_lock(&q->rlock);
		q->r_head = q->r_tail;
		pthread_spin_unlock(&q->rlock);
		break;
	case IBV_QPS_ERR:
		atomic_store(&q->post_ok, 1);
		atomic_store(&q->inited, 1);
		break;
	default:
		break;
	}
	q->qp.state = s;
	return 0;
}

SW_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct sw_qp *q = (struct sw_qp *)ibqp;
	if (!(mask & IBV_QP_STATE))
		return 0; /* iWARP: the other attributes come from the connection */
	switch (attr->qp_state) {
	case IBV_QPS_INIT:
		/* Once connection management has moved the QP on, INIT is where
		 * it has been: a program that walks a connected QP through
		 * INIT, RTR, RTS itself (rping -q) finds nothing to do. */
		if (atomic_load(&q->post_ok) && ibqp->state != IBV_QPS_ERR)
			return 0;
		return sw_qp_modify_state(q, attr->qp_state);
	case IBV_QPS_RESET:
	case IBV_QPS_ERR:
		return sw_qp_modify_state(q, attr->qp_state);
	case IBV_QPS_RTR:
	case IBV_QPS_RTS:
		/* Entered by connection management (rdma_connect/rdma_accept),
		 * as on every iWARP device; a self-created QP's move is a
		 * no-op once it is INIT. */
		if (!atomic_load(&q->inited))
			return EINVAL;
		if (atomic_load(&q->post_ok))
			ibqp->state = attr->qp_state;
		return 0;
	default:
		return EINVAL;
	}
}

/* The local and remote address of QP h's connection (QueryQP). */
int sw_qp_addrs(struct sw_context *ctx, uint32_t h, struct sockaddr_storage *local, struct sockaddr_storage *remote)
{
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, h);
	int err = sw_call(ctx->conn, SW_OP_QUERY_QP, &e, NULL, 0, &r);
	if (!err) {
		sw_close_fds(&r);
		err = sw_status_errno(&r);
	}
	if (err)
		return err;
	struct sw_dec d = {r.body, r.blen, 0};
	sw_dec_u32(&d); /* state */
	sw_dec_addr(&d, local);
	sw_dec_addr(&d, remote);
	return d.err ? EPROTO : 0;
}

SW_EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init)
{
	struct sw_qp *q = (struct sw_qp *)ibqp;
	(void)mask;
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, q->h);
	int err = sw_call(to_ctx(ibqp->context)->conn, SW_OP_QUERY_QP, &e, NULL, 0, &r);
	if (!err) {
		sw_close_fds(&r);
		err = sw_status_errno(&r);
	}
	if (err)
		return err;
	struct sw_dec d = {r.body, r.blen, 0};
	struct sockaddr_storage la, ra;
	uint32_t st = sw_dec_u32(&d);
	sw_dec_addr(&d, &la);
	sw_dec_addr(&d, &ra);
	sw_dec_u8(&d); /* MPA rev */
	sw_dec_u8(&d); /* CRC */
	sw_dec_u8(&d);
	sw_dec_u8(&d);
	uint32_t ird = sw_dec_u32(&d), ord = sw_dec_u32(&d);
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = attr->cur_qp_state = (enum ibv_qp_state)st;
	attr->path_mtu = IBV_MTU_1024;
	attr->cap = q->cap;
	attr->max_rd_atomic = (uint8_t)(ord > 255 ? 255 : ord);
	attr->max_dest_rd_atomic = (uint8_t)(ird > 255 ? 255 : ird);
	attr->port_num = 1;
	attr->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	if (init) {
		memset(init, 0, sizeof(*init));
		init->qp_context = ibqp->qp_context;
		init->send_cq = ibqp->send_cq;
		init->recv_cq = ibqp->recv_cq;
		init->srq = ibqp->srq;
		init->cap = q->cap;
		init->qp_type = IBV_QPT_RC;
		init->sq_sig_all = q->sig_all;
	}
	ibqp->state = attr->qp_state;
	return 0;
}

/* wait_free waits for the daemon to hand back a ring entry our accounting
 * says is free: the daemon releases an entry after handing its request to
 * the engine, which may complete it (and the application poll that
 * completion and post again) first. The wait is short; ENOMEM after 100 ms
 * (the daemon is stuck or gone). */
int sw_wait_free(const uint8_t *e)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; ld32(e) != 0; i++) {
		if (i < 64)
			continue;
		sched_yield();
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > 100000000L)
			return ENOMEM;
	}
	return 0;
}

/* Whether q takes posts now: ENODEV once the daemon is gone, EINVAL while
 * ok (post_ok for sends, inited for receives) is 0. */
static int post_allowed(struct sw_qp *q, atomic_int *ok)
{
	if (atomic_load(&to_ctx(q->qp.context)->removed))
		return ENODEV;
	return atomic_load(ok) ? 0 : EINVAL;
}

/* Writes n scatter/gather elements into a ring entry's SGL at s. */
void sw_put_sgl(uint8_t *s, const struct ibv_sge *sg, int n)
{
	for (int i = 0; i < n; i++, s += SW_SGE_SIZE) {
		put64(s + SW_SGE_ADDR, sg[i].addr);
		put32(s + SW_SGE_LENGTH, sg[i].length);
		put32(s + SW_SGE_LKEY, sg[i].lkey);
	}
}

static inline void ring_doorbell(struct sw_qp *q, const uint8_t *ring)
{
	if (ld32(ring + SW_RING_HDR_NOTIFY)) {
		uint64_t one = 1;
		if (write(q->doorbell, &one, sizeof(one)) < 0) {
			/* EAGAIN: saturated, the daemon wakes anyway */
		}
	}
}

/* check_send_wr: whether q may post wr: its flags, its opcode (and the
 * RDMAP extension the opcode needs, negotiated with the peer), its SGEs. */
static int check_send_wr(struct sw_qp *q, const struct ibv_send_wr *wr)
{
	uint32_t flags = wr->send_flags;
	if (flags & ~(unsigned int)(IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE))
		return EINVAL;
	int err = 0;
	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_SEND_WITH_IMM:
		/* RFC 7306 Immediate Data: only toward a peer that negotiated
		 * it; never on the wire toward any other. */
		if (!(atomic_load(&q->ext) & SW_EXT_IMMEDIATE))
			return EOPNOTSUPP;
		/* fallthrough */
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_INV:
		if (!(flags & IBV_SEND_INLINE) && wr->num_sge > SW_MAX_SGE)
			err = EINVAL;
		break;
	case IBV_WR_RDMA_READ:
		if ((flags & IBV_SEND_INLINE) || wr->num_sge > SW_MAX_SGE_READ)
			err = EINVAL;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		/* RFC 7306 atomics: only toward a peer that announced them;
		 * the 8-byte result buffer is the one SGE. */
		if (!(atomic_load(&q->ext) & SW_EXT_ATOMIC))
			err = EOPNOTSUPP;
		else if ((flags & IBV_SEND_INLINE) || wr->num_sge != 1 || wr->sg_list[0].length != 8)
			err = EINVAL;
		break;
	case IBV_WR_BIND_MW:
		/* The window and its region belong to this context; the
		 * daemon checks the rest when the QP performs it. */
		if (!wr->bind_mw.mw || wr->bind_mw.mw->context != q->qp.context ||
		    (wr->bind_mw.bind_info.mr && wr->bind_mw.bind_info.mr->context != q->qp.context) ||
		    (wr->bind_mw.rkey >> 8) != (wr->bind_mw.mw->rkey >> 8))
			err = EINVAL;
		/* fallthrough */
	case IBV_WR_LOCAL_INV:
		/* Local memory operations: nothing inline, no SGEs. */
		if (flags & (IBV_SEND_INLINE | IBV_SEND_SOLICITED))
			err = EINVAL;
		break;
	default:
		err = EINVAL;
	}
	if (!err && wr->num_sge < 0)
		err = EINVAL;
	return err;
}

/* sq_next is the send ring's next entry, or NULL when the send queue is
 * full: its shadow ring has no room, or the daemon does not hand the
 * entry back in time (see sw_wait_free). */
static uint8_t *sq_next(struct sw_qp *q)
{
	uint8_t *e = q->sq + SW_RING_HEADER_SIZE + (size_t)(q->sq_prod & (q->sq_count - 1)) * SW_SQE_SIZE;
	if (q->s_tail - q->s_head == q->nsent || (ld32(e) != 0 && sw_wait_free(e)))
		return NULL;
	return e;
}

/* put_mem_op fills ring entry e for a local memory operation, BIND_MW or
 * LOCAL_INV: no data; the window's key (or the key to invalidate) and,
 * for a bind, its new key, range, region and access. */
static void put_mem_op(uint8_t *e, const struct ibv_send_wr *wr)
{
	const struct ibv_mw_bind_info *b = &wr->bind_mw.bind_info;
	int bind = wr->opcode == IBV_WR_BIND_MW;
	e[SW_SQE_NSGE] = 0;
	put16(e + SW_SQE_INLINE_LEN, 0);
	put32(e + SW_SQE_FLAGS, wr->send_flags);
	put64(e + SW_SQE_ID, wr->wr_id);
	put32(e + SW_SQE_IMM_DATA, 0);
	put32(e + SW_SQE_INV_RKEY, bind ? wr->bind_mw.mw->rkey : wr->invalidate_rkey);
	put32(e + SW_SQE_RKEY, bind ? wr->bind_mw.rkey : 0);
	put64(e + SW_SQE_REMOTE_ADDR, bind ? b->addr : 0);
	put64(e + SW_SQE_BIND_LENGTH, bind ? b->length : 0);
	put32(e + SW_SQE_BIND_MR_LKEY, bind && b->mr ? b->mr->lkey : 0);
	put32(e + SW_SQE_BIND_ACCESS, bind ? b->mw_access_flags : 0);
	put32(e + SW_SQE_BIND_TYPE1, bind && wr->bind_mw.mw->type == IBV_MW_TYPE_1);
}

/* put_inline copies the data wr's SGEs gather into ring entry e (the
 * entry then has no SGL): EINVAL when it is more than SW_MAX_INLINE. */
static int put_inline(uint8_t *e, const struct ibv_send_wr *wr)
{
	size_t tot = 0;
	for (int i = 0; i < wr->num_sge; i++)
		tot += wr->sg_list[i].length;
	if (tot > SW_MAX_INLINE)
		return EINVAL;
	tot = 0;
	for (int i = 0; i < wr->num_sge; i++) {
		memcpy(e + SW_SQE_INLINE + tot, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
		tot += wr->sg_list[i].length;
	}
	e[SW_SQE_NSGE] = 0;
	put16(e + SW_SQE_INLINE_LEN, (uint16_t)tot);
	return 0;
}

/* put_data_op fills ring entry e for a Send, Write, Read or atomic: its
 * data (inline, or the SGL), the remote buffer, the operands of an atomic
 * and the immediate data. EINVAL for inline data that does not fit. */
static int put_data_op(uint8_t *e, const struct ibv_send_wr *wr)
{
	if (wr->send_flags & IBV_SEND_INLINE) {
		int err = put_inline(e, wr);
		if (err)
			return err;
	} else {
		e[SW_SQE_NSGE] = (uint8_t)wr->num_sge;
		put16(e + SW_SQE_INLINE_LEN, 0);
		sw_put_sgl(e + SW_SQE_SGL, wr->sg_list, wr->num_sge);
	}
	put32(e + SW_SQE_FLAGS, wr->send_flags);
	put32(e + SW_SQE_INV_RKEY, wr->opcode == IBV_WR_SEND_WITH_INV ? wr->invalidate_rkey : 0);
	put64(e + SW_SQE_ID, wr->wr_id);
	if (wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		/* wr.atomic's rkey is not where wr.rdma's is. */
		put64(e + SW_SQE_REMOTE_ADDR, wr->wr.atomic.remote_addr);
		put32(e + SW_SQE_RKEY, wr->wr.atomic.rkey);
		put64(e + SW_SQE_COMPARE_ADD, wr->wr.atomic.compare_add);
		put64(e + SW_SQE_SWAP, wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? wr->wr.atomic.swap : 0);
	} else {
		put64(e + SW_SQE_REMOTE_ADDR, wr->wr.rdma.remote_addr);
		put32(e + SW_SQE_RKEY, wr->wr.rdma.rkey);
	}
	int imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM;
	put32(e + SW_SQE_IMM_DATA, imm ? be32toh(wr->imm_data) : 0);
	return 0;
}

/* publish_send hands the filled entry e to the daemon and remembers wr in
 * the shadow ring, for its completion (or its flush). */
static void publish_send(struct sw_qp *q, uint8_t *e, const struct ibv_send_wr *wr)
{
	st32(e, SW_OWNER_VALID);
	q->sq_prod++;
	q->sent[q->s_tail % q->nsent] =
		(struct sw_shadow){wr->wr_id, wr->opcode, (wr->send_flags & IBV_SEND_SIGNALED) || q->sig_all};
	q->s_tail++;
}

int sw_ctx_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct sw_qp *q = (struct sw_qp *)ibqp;
	pthread_spin_lock(&q->slock);
	int err = post_allowed(q, &q->post_ok), n = 0;
	for (; !err && wr; wr = wr->next) {
		if ((err = check_send_wr(q, wr)))
			break;
		uint8_t *e = sq_next(q);
		if (!e) {
			err = ENOMEM;
			break;
		}
		e[SW_SQE_OPCODE] = (uint8_t)wr->opcode;
		if (wr->opcode == IBV_WR_BIND_MW || wr->opcode == IBV_WR_LOCAL_INV)
			put_mem_op(e, wr);
		else if ((err = put_data_op(e, wr)))
			break;
		publish_send(q, e, wr);
		n++;
	}
	if (n)
		ring_doorbell(q, q->sq);
	pthread_spin_unlock(&q->slock);
	if (err)
		*bad = wr;
	return err;
}

/* ---- MW ---- */

struct ibv_mw *sw_ctx_alloc_mw(struct ibv_pd *ibpd, enum ibv_mw_type type)
{
	struct sw_pd *pd = (struct sw_pd *)ibpd;
	if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2)
		return fail_null(EINVAL);
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, pd->h);
	sw_enc_u32(&e, (uint32_t)type);
	int err = create_call(to_ctx(ibpd->context), SW_OP_ALLOC_MW, &e, &r);
	if (err)
		return fail_null(err);
	sw_close_fds(&r);
	struct sw_dec d = {r.body, r.blen, 0};
	struct sw_mw *mw = calloc(1, sizeof(*mw));
	if (!mw) {
		destroy_call(to_ctx(ibpd->context), SW_OP_DEALLOC_MW, sw_dec_u32(&d));
		return fail_null(ENOMEM);
	}
	mw->h = sw_dec_u32(&d);
	mw->mw.rkey = sw_dec_u32(&d);
	mw->mw.handle = mw->h;
	mw->mw.context = ibpd->context;
	mw->mw.pd = ibpd;
	mw->mw.type = type;
	return &mw->mw;
}

int sw_ctx_dealloc_mw(struct ibv_mw *mw)
{
	return destroy_free(mw->context, SW_OP_DEALLOC_MW, ((struct sw_mw *)mw)->h, mw);
}

/* ibv_bind_mw of a type 1 window (libibverbs checked the type and the
 * region's PD): a BIND_MW request posted on qp giving the window its next
 * key, as rdma-core's providers do; the window's rkey is the new one once
 * the request is posted. */
int sw_ctx_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind)
{
	if (qp->context != mw->context)
		return EINVAL;
	struct ibv_send_wr wr = {.wr_id = mw_bind->wr_id, .opcode = IBV_WR_BIND_MW, .send_flags = mw_bind->send_flags};
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = mw_bind->bind_info;
	struct ibv_send_wr *bad;
	int err = sw_ctx_post_send(qp, &wr, &bad);
	if (!err)
		mw->rkey = wr.bind_mw.rkey;
	return err;
}

int sw_ctx_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct sw_qp *q = (struct sw_qp *)ibqp;
	if (q->srq) { /* its receives are posted to the SRQ */
		*bad = wr;
		return EINVAL;
	}
	pthread_spin_lock(&q->rlock);
	int err = post_allowed(q, &q->inited), n = 0;
	for (; !err && wr; wr = wr->next) {
		if (wr->num_sge > SW_MAX_SGE || wr->num_sge < 0) {
			err = EINVAL;
			break;
		}
		uint8_t *e = q->rq + SW_RING_HEADER_SIZE + (size_t)(q->rq_prod & (q->rq_count - 1)) * SW_RQE_SIZE;
		if (q->r_tail - q->r_head == q->nrecvd || (ld32(e) != 0 && sw_wait_free(e))) {
			err = ENOMEM;
			break;
		}
		e[SW_RQE_NSGE] = (uint8_t)wr->num_sge;
		put64(e + SW_RQE_ID, wr->wr_id);
		sw_put_sgl(e + SW_RQE_SGL, wr->sg_list, wr->num_sge);
		st32(e, SW_OWNER_VALID);
		q->rq_prod++;
		q->recvd[q->r_tail % q->nrecvd] = wr->wr_id;
		q->r_tail++;
		n++;
	}
	if (n)
		ring_doorbell(q, q->rq);
	pthread_spin_unlock(&q->rlock);
	if (err)
		*bad = wr;
	return err;
}
