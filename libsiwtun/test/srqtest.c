/* siwtun-srqtest: shared receive queues through libibverbs and librdmacm
 * (built with -fsanitize=address,undefined against the system libraries,
 * run with libsiwtun preloaded) on two siwtun daemons:
 *
 *   siwtun-srqtest DEV_A DEV_B [PORT]
 *
 * DEV_B listens; NQP ids of DEV_A connect, and each of DEV_B's accepted
 * ids gets a QP on one SRQ (the first made by rdma_create_srq on its id,
 * which its rdma_create_qp takes; the others name it in their attributes).
 * Checks: the device's SRQ limits; ibv_create_srq's refusals;
 * ibv_post_recv on a QP with an SRQ (EINVAL, bad_wr set) and its
 * ibv_query_qp; ibv_post_srq_recv's errors (EINVAL for too many SGEs and
 * ENOMEM when full, bad_wr at the request that failed, the ones before it
 * posted); rounds of Sends from every QP, each message checked in the
 * receive its completion names, with the QP number of the QP it arrived
 * on; the limit event (ibv_modify_srq's IBV_SRQ_LIMIT) through
 * ibv_get_async_event, once, after which ibv_query_srq shows the limit
 * disarmed; ibv_destroy_srq of an SRQ in use (EBUSY); growing the SRQ with
 * IBV_SRQ_MAX_WR and using the new depth. Prints "ok NAME" per check;
 * exits 1 at the first failure. */
#define _GNU_SOURCE
#include <poll.h>

#include <rdma/rdma_verbs.h>

#include "testlib.h"

#define NQP 4
#define DEPTH 16
#define GROWN 64
#define SLOT 2048

/* The receiver: B's side. */
static struct {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_mr *mr;
	uint8_t *buf; /* GROWN slots */
	struct rdma_cm_id *ids[NQP];
	int next[NQP];        /* the next message each QP expects */
	int taken[NQP * 4];   /* the slots the last round's receives used */
} rx;

/* The sender: A's side. */
static struct {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *buf; /* NQP * 4 slots */
	struct rdma_cm_id *ids[NQP];
	int seq;
} tx;

static void fill(uint8_t *b, int q, int seq, size_t n)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(q * 7 + seq * 13 + i * 3);
}

static size_t msg_len(int q, int seq) { return 16 + (size_t)(q * 131 + seq * 17) % (SLOT - 16); }

static void post_slot(int i)
{
	struct ibv_sge s = {(uintptr_t)(rx.buf + (size_t)i * SLOT), SLOT, rx.mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &s, .num_sge = 1}, *bad = NULL;
	CHECK(ibv_post_srq_recv(rx.srq, &wr, &bad) == 0, "post srq recv slot %d", i);
}

/* One round: every sender QP sends per messages; the receiver checks each
 * in the slot its completion names and, if repost, posts the slot again. */
static void round_(int per, int repost)
{
	struct ibv_wc wc[NQP * 4];
	for (int q = 0; q < NQP; q++) {
		for (int k = 0; k < per; k++) {
			uint8_t *b = tx.buf + (size_t)(q * 4 + k) * SLOT;
			size_t n = msg_len(q, tx.seq + k);
			fill(b, q, tx.seq + k, n);
			struct ibv_sge s = {(uintptr_t)b, (uint32_t)n, tx.mr->lkey};
			struct ibv_send_wr wr = {.wr_id = (uint64_t)k, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
						 .send_flags = IBV_SEND_SIGNALED},
					   *bad;
			CHECK(ibv_post_send(tx.ids[q]->qp, &wr, &bad) == 0, "post send");
		}
	}
	tl_poll_n(tx.cq, NQP * per, wc);
	for (int i = 0; i < NQP * per; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS, "send status %s", ibv_wc_status_str(wc[i].status));
	tl_poll_n(rx.cq, NQP * per, wc);
	for (int i = 0; i < NQP * per; i++) {
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV, "receive status %s",
		      ibv_wc_status_str(wc[i].status));
		int q = -1;
		for (int j = 0; j < NQP; j++)
			if (rx.ids[j]->qp->qp_num == wc[i].qp_num)
				q = j;
		CHECK(q >= 0, "completion of QP %u, not one of the SRQ's", wc[i].qp_num);
		size_t n = msg_len(q, rx.next[q]);
		uint8_t want[SLOT];
		fill(want, q, rx.next[q], n);
		CHECK(wc[i].byte_len == n && !memcmp(rx.buf + wc[i].wr_id * SLOT, want, n),
		      "QP %u message %d in slot %lu: %u bytes, want %zu", wc[i].qp_num, rx.next[q],
		      (unsigned long)wc[i].wr_id, wc[i].byte_len, n);
		rx.next[q]++;
		rx.taken[i] = (int)wc[i].wr_id;
		if (repost)
			post_slot((int)wc[i].wr_id);
	}
	tx.seq += per;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	CHECK(argc >= 3, "usage: siwtun-srqtest DEV_A DEV_B [PORT]");
	int port = argc > 3 ? atoi(argv[3]) : 17980;
	struct ibv_context *ca = tl_open_dev(argv[1]), *cb = tl_open_dev(argv[2]);

	struct ibv_device_attr da;
	CHECK(ibv_query_device(cb, &da) == 0, "query device");
	CHECK(da.max_srq > 0 && da.max_srq_wr == 16384 && da.max_srq_sge == 6 && (da.device_cap_flags & IBV_DEVICE_SRQ_RESIZE),
	      "SRQ limits: max_srq %d max_srq_wr %d max_srq_sge %d", da.max_srq, da.max_srq_wr, da.max_srq_sge);
	OK("device srq attributes");

	struct sockaddr_in addr_a, addr_b;
	tl_get_addr(ca, &addr_a);
	tl_get_addr(cb, &addr_b);
	addr_b.sin_port = htons((uint16_t)port);
	struct rdma_event_channel *cha = rdma_create_event_channel(), *chb = rdma_create_event_channel();
	CHECK(cha && chb, "event channels");
	struct rdma_cm_id *lid = tl_listen(chb, &addr_b, NQP);

	/* Each side's objects on the context its ids use (rdma_cm's). */
	rx.pd = ibv_alloc_pd(lid->verbs);
	rx.cq = ibv_create_cq(lid->verbs, 4 * GROWN, NULL, NULL, 0);
	rx.buf = calloc(GROWN, SLOT);
	CHECK(rx.pd && rx.cq && rx.buf, "receiver resources");
	rx.mr = ibv_reg_mr(rx.pd, rx.buf, (size_t)GROWN * SLOT, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rx.mr, "receiver MR");

	/* ibv_create_srq's refusals. */
	struct ibv_srq_init_attr bad0 = {.attr = {.max_wr = 0, .max_sge = 1}};
	struct ibv_srq_init_attr bigwr = {.attr = {.max_wr = (uint32_t)da.max_srq_wr + 1, .max_sge = 1}};
	struct ibv_srq_init_attr bigsge = {.attr = {.max_wr = 4, .max_sge = 7}};
	errno = 0;
	CHECK(!ibv_create_srq(rx.pd, &bad0) && errno == EINVAL, "SRQ of depth 0");
	errno = 0;
	CHECK(!ibv_create_srq(rx.pd, &bigwr) && errno == EINVAL, "SRQ deeper than max_srq_wr");
	errno = 0;
	CHECK(!ibv_create_srq(rx.pd, &bigsge) && errno == EINVAL, "SRQ with more SGEs than max_srq_sge");
	OK("create srq refusals");
	/* ibv_create_srq_ex of a basic SRQ is ibv_create_srq (rdma-core's
	 * inline); a tag-matching one has no provider op. */
	{
		struct ibv_srq_init_attr_ex x = {.attr = {.max_wr = 4, .max_sge = 2},
						 .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
						 .srq_type = IBV_SRQT_BASIC, .pd = rx.pd};
		struct ibv_srq *s = ibv_create_srq_ex(lid->verbs, &x);
		CHECK(s && x.attr.max_sge == 6, "ibv_create_srq_ex basic");
		struct ibv_srq_attr a;
		CHECK(ibv_query_srq(s, &a) == 0 && a.max_wr == 4 && a.srq_limit == 0, "query srq ex: max_wr %u", a.max_wr);
		CHECK(ibv_destroy_srq(s) == 0, "destroy srq ex");
		x.srq_type = IBV_SRQT_TM;
		errno = 0;
		CHECK(!ibv_create_srq_ex(lid->verbs, &x) && errno == EOPNOTSUPP, "tag-matching SRQ");
	}
	OK("create srq ex");

	/* Connect NQP ids; the first accepted id makes the SRQ with
	 * rdma_create_srq and its rdma_create_qp takes it. */
	for (int i = 0; i < NQP; i++) {
		CHECK(rdma_create_id(cha, &tx.ids[i], NULL, RDMA_PS_TCP) == 0, "create id");
		tl_resolve(tx.ids[i], &addr_a, &addr_b);
		if (i == 0) {
			tx.pd = ibv_alloc_pd(tx.ids[0]->verbs);
			tx.cq = ibv_create_cq(tx.ids[0]->verbs, 4 * NQP * 4, NULL, NULL, 0);
			tx.buf = calloc(NQP * 4, SLOT);
			CHECK(tx.pd && tx.cq && tx.buf, "sender resources");
			tx.mr = ibv_reg_mr(tx.pd, tx.buf, (size_t)NQP * 4 * SLOT, IBV_ACCESS_LOCAL_WRITE);
			CHECK(tx.mr, "sender MR");
		}
		struct ibv_qp_init_attr qa = {.send_cq = tx.cq, .recv_cq = tx.cq, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
		CHECK(rdma_create_qp(tx.ids[i], tx.pd, &qa) == 0, "sender QP");
		CHECK(rdma_connect(tx.ids[i], NULL) == 0, "connect");
		rx.ids[i] = tl_request(chb);
		struct ibv_qp_init_attr qb = {.send_cq = rx.cq, .recv_cq = rx.cq, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 4, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
		if (i == 0) {
			struct ibv_srq_init_attr sa = {.srq_context = &rx, .attr = {.max_wr = DEPTH, .max_sge = 1}};
			CHECK(rdma_create_srq(rx.ids[0], rx.pd, &sa) == 0 && rx.ids[0]->srq, "rdma_create_srq");
			CHECK(sa.attr.max_sge == 6, "SRQ max_sge %u", sa.attr.max_sge);
			rx.srq = rx.ids[0]->srq;
			CHECK(rx.srq->srq_context == &rx && rx.srq->pd == rx.pd, "SRQ context and PD");
		} else {
			qb.srq = rx.srq;
		}
		CHECK(rdma_create_qp(rx.ids[i], rx.pd, &qb) == 0, "receiver QP %d", i);
		CHECK(rx.ids[i]->qp->srq == rx.srq, "QP %d on the SRQ", i);
		CHECK(rdma_accept(rx.ids[i], NULL) == 0, "accept");
		tl_established(cha, chb);
	}
	OK("connect QPs on one SRQ");

	/* A QP on an SRQ has no receive queue of its own. */
	{
		struct ibv_qp_attr qattr;
		struct ibv_qp_init_attr init;
		CHECK(ibv_query_qp(rx.ids[1]->qp, &qattr, IBV_QP_STATE | IBV_QP_CAP, &init) == 0, "query qp");
		CHECK(init.srq == rx.srq && init.cap.max_recv_wr == 0, "query qp: srq %p, max_recv_wr %u", (void *)init.srq,
		      init.cap.max_recv_wr);
		struct ibv_sge s = {(uintptr_t)rx.buf, SLOT, rx.mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &s, .num_sge = 1}, *bad = NULL;
		CHECK(ibv_post_recv(rx.ids[1]->qp, &wr, &bad) == EINVAL && bad == &wr, "ibv_post_recv on a QP with an SRQ");
	}
	OK("qp with srq");

	/* ibv_post_srq_recv's errors: bad_wr at the request that failed,
	 * those before it posted. */
	{
		struct ibv_sge s[7];
		for (int i = 0; i < 7; i++)
			s[i] = (struct ibv_sge){(uintptr_t)(rx.buf + (size_t)i * 16), 16, rx.mr->lkey};
		struct ibv_recv_wr seven = {.wr_id = 100, .sg_list = s, .num_sge = 7}, *bad = NULL;
		CHECK(ibv_post_srq_recv(rx.srq, &seven, &bad) == EINVAL && bad == &seven, "7 SGEs");
		for (int i = 0; i < DEPTH - 1; i++)
			post_slot(i);
		struct ibv_sge s1 = {(uintptr_t)(rx.buf + (size_t)(DEPTH - 1) * SLOT), SLOT, rx.mr->lkey};
		struct ibv_sge s2 = {(uintptr_t)(rx.buf + (size_t)DEPTH * SLOT), SLOT, rx.mr->lkey};
		struct ibv_recv_wr w2 = {.wr_id = DEPTH, .sg_list = &s2, .num_sge = 1};
		struct ibv_recv_wr w1 = {.wr_id = DEPTH - 1, .sg_list = &s1, .num_sge = 1, .next = &w2};
		bad = NULL;
		CHECK(ibv_post_srq_recv(rx.srq, &w1, &bad) == ENOMEM && bad == &w2, "the receive past the depth");
	}
	OK("post srq recv errors");

	for (int r = 0; r < 20; r++)
		round_(2, 1);
	OK("rounds");

	/* The limit event: armed at 12 with 16 posted; one round of 8 takes
	 * the count to 8 and the test posts nothing back until the event. */
	{
		struct ibv_srq_attr a = {.srq_limit = 12};
		CHECK(ibv_modify_srq(rx.srq, &a, IBV_SRQ_LIMIT) == 0, "arm the limit");
		memset(&a, 0, sizeof(a));
		CHECK(ibv_query_srq(rx.srq, &a) == 0 && a.srq_limit == 12 && a.max_wr == DEPTH && a.max_sge == 6,
		      "query srq: limit %u max_wr %u max_sge %u", a.srq_limit, a.max_wr, a.max_sge);
		struct ibv_srq_attr big = {.srq_limit = DEPTH + 1};
		CHECK(ibv_modify_srq(rx.srq, &big, IBV_SRQ_LIMIT) == EINVAL, "a limit above the depth");
		int before[NQP];
		memcpy(before, rx.next, sizeof(before));
		round_(2, 0);
		struct ibv_context *rc = rx.srq->context;
		struct pollfd p = {.fd = rc->async_fd, .events = POLLIN};
		CHECK(poll(&p, 1, 10000) == 1, "no async event");
		struct ibv_async_event ev;
		CHECK(ibv_get_async_event(rc, &ev) == 0, "get async event");
		CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == rx.srq, "async event %s (%d)",
		      ibv_event_type_str(ev.event_type), ev.event_type);
		ibv_ack_async_event(&ev);
		CHECK(ibv_query_srq(rx.srq, &a) == 0 && a.srq_limit == 0, "limit %u after the event, want 0", a.srq_limit);
		/* Post the 8 slots back (the ones this round used) and run on:
		 * no second event without arming again. */
		for (int q = 0; q < NQP; q++)
			CHECK(rx.next[q] == before[q] + 2, "QP %d", q);
		for (int i = 0; i < NQP * 2; i++)
			post_slot(rx.taken[i]);
		round_(2, 1);
		p.revents = 0;
		CHECK(poll(&p, 1, 200) == 0, "a second async event without re-arming");
	}
	OK("srq limit event");

	errno = 0;
	CHECK(ibv_destroy_srq(rx.srq) == EBUSY, "destroy an SRQ in use");
	OK("destroy srq in use");

	/* Grow to GROWN: the posted receives stay, GROWN - DEPTH more fit. */
	{
		struct ibv_srq_attr a = {.max_wr = GROWN};
		CHECK(ibv_modify_srq(rx.srq, &a, IBV_SRQ_MAX_WR) == 0, "grow the SRQ");
		CHECK(ibv_query_srq(rx.srq, &a) == 0 && a.max_wr == GROWN, "max_wr %u", a.max_wr);
		/* Slots 0..DEPTH-1 are posted (the rounds post each back);
		 * DEPTH..GROWN-1 fill the new depth, and one more is refused. */
		for (int i = DEPTH; i < GROWN; i++)
			post_slot(i);
		struct ibv_sge s = {(uintptr_t)rx.buf, SLOT, rx.mr->lkey};
		struct ibv_recv_wr w = {.wr_id = 0, .sg_list = &s, .num_sge = 1}, *bad = NULL;
		CHECK(ibv_post_srq_recv(rx.srq, &w, &bad) == ENOMEM && bad == &w, "a receive past the new depth");
		for (int r = 0; r < 8; r++)
			round_(4, 1);
		struct ibv_srq_attr small = {.max_wr = 8};
		CHECK(ibv_modify_srq(rx.srq, &small, IBV_SRQ_MAX_WR) == EINVAL, "shrinking below the posted receives");
	}
	OK("grow srq");

	for (int i = 0; i < NQP; i++) {
		CHECK(rdma_disconnect(tx.ids[i]) == 0, "disconnect");
		tl_disconnected(cha, chb);
	}
	for (int i = NQP - 1; i >= 0; i--) {
		rdma_destroy_qp(rx.ids[i]);
		if (i == 0) {
			rdma_destroy_srq(rx.ids[0]);
			CHECK(rx.ids[0]->srq == NULL, "rdma_destroy_srq");
		}
		CHECK(rdma_destroy_id(rx.ids[i]) == 0, "destroy id");
		rdma_destroy_qp(tx.ids[i]);
		CHECK(rdma_destroy_id(tx.ids[i]) == 0, "destroy id");
	}
	/* Receives completed flushed when the QPs went: none were taken. */
	struct ibv_wc wc;
	while (ibv_poll_cq(rx.cq, 1, &wc) > 0)
		CHECK(wc.status == IBV_WC_WR_FLUSH_ERR, "left completion %s", ibv_wc_status_str(wc.status));
	CHECK(ibv_dereg_mr(rx.mr) == 0 && ibv_dereg_mr(tx.mr) == 0, "dereg");
	CHECK(ibv_destroy_cq(rx.cq) == 0 && ibv_destroy_cq(tx.cq) == 0, "destroy cq");
	CHECK(ibv_dealloc_pd(rx.pd) == 0 && ibv_dealloc_pd(tx.pd) == 0, "dealloc pd");
	CHECK(rdma_destroy_id(lid) == 0, "destroy listen id");
	rdma_destroy_event_channel(cha);
	rdma_destroy_event_channel(chb);
	free(rx.buf);
	free(tx.buf);
	CHECK(ibv_close_device(ca) == 0 && ibv_close_device(cb) == 0, "close");
	OK("teardown");
	printf("PASS\n");
	return 0;
}
