/* siwtun-mwtest: memory windows through libibverbs and librdmacm (built
 * with -fsanitize=address,undefined against the system libraries, run with
 * libsiwtun preloaded) on two siwtun daemons:
 *
 *   siwtun-mwtest DEV_A DEV_B [PORT]
 *
 * DEV_B listens and owns the windows; DEV_A connects and uses them.
 * Checks: ibv_query_device's max_mw and IBV_DEVICE_MEM_WINDOW{,_TYPE_2B};
 * ibv_alloc_mw of types 1 and 2 (and EINVAL for another type); a type 2
 * window bound by IBV_WR_BIND_MW at an offset of a region registered with
 * IBV_ACCESS_MW_BIND, A's RDMA Write and Read through it; a type 1 window
 * bound by ibv_bind_mw (its rkey the next key, IBV_WC_BIND_MW) and read,
 * ibv_bind_mw of a type 2 window (EINVAL); A's Send with Invalidate of the
 * type 2 window (B's receive: IBV_WC_WITH_INV and the rkey); the window
 * bound again under a new key and invalidated by IBV_WR_LOCAL_INV
 * (IBV_WC_LOCAL_INV); ibv_dereg_mr of the region with a window bound
 * (EBUSY); A's Write to the invalidated window: nothing lands and A's QP
 * is terminated (its next Read completes in error); ibv_dealloc_mw, then
 * ibv_dereg_mr. Prints "ok NAME" per check; exits 1 at the first
 * failure. */
#define _GNU_SOURCE
#include "testlib.h"

#define SIZE 8192

/* A posts one request on qp and polls its completion from cq. */
static struct ibv_wc post_one(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(qp, wr, &bad) == 0, "post send opcode %d", wr->opcode);
	return tl_poll(cq);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	CHECK(argc >= 3, "usage: siwtun-mwtest DEV_A DEV_B [PORT]");
	int port = argc > 3 ? atoi(argv[3]) : 17990;
	struct ibv_context *ca = tl_open_dev(argv[1]), *cb = tl_open_dev(argv[2]);

	struct ibv_device_attr da;
	CHECK(ibv_query_device(cb, &da) == 0, "query device");
	CHECK(da.max_mw > 0 && (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
		      (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B),
	      "max_mw %d, device_cap_flags 0x%x", da.max_mw, da.device_cap_flags);
	OK("device mw attributes");

	struct sockaddr_in addr_a, addr_b;
	tl_get_addr(ca, &addr_a);
	tl_get_addr(cb, &addr_b);
	addr_b.sin_port = htons((uint16_t)port);
	struct rdma_event_channel *cha = rdma_create_event_channel(), *chb = rdma_create_event_channel();
	CHECK(cha && chb, "event channels");
	struct rdma_cm_id *lid = tl_listen(chb, &addr_b, 1), *ida, *idb;

	/* B: the region windows are bound into, and the windows. */
	struct ibv_pd *pdb = ibv_alloc_pd(lid->verbs);
	struct ibv_cq *cqb = ibv_create_cq(lid->verbs, 16, NULL, NULL, 0);
	uint8_t *bufb = calloc(1, SIZE);
	CHECK(pdb && cqb && bufb, "B's resources");
	struct ibv_mr *mrb = ibv_reg_mr(pdb, bufb, SIZE,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND);
	CHECK(mrb, "B's region with MW_BIND");
	errno = 0;
	CHECK(!ibv_alloc_mw(pdb, (enum ibv_mw_type)3) && errno == EINVAL, "ibv_alloc_mw of type 3");
	struct ibv_mw *mw1 = ibv_alloc_mw(pdb, IBV_MW_TYPE_1), *mw2 = ibv_alloc_mw(pdb, IBV_MW_TYPE_2);
	CHECK(mw1 && mw2 && mw1->type == IBV_MW_TYPE_1 && mw2->type == IBV_MW_TYPE_2 && mw1->pd == pdb &&
		      mw2->context == lid->verbs && (mw1->rkey >> 8) != (mw2->rkey >> 8) && (mw2->rkey >> 8) != (mrb->rkey >> 8),
	      "ibv_alloc_mw");
	OK("alloc mw");

	/* Connect A to B. */
	CHECK(rdma_create_id(cha, &ida, NULL, RDMA_PS_TCP) == 0, "create id");
	tl_resolve(ida, &addr_a, &addr_b);
	struct ibv_pd *pda = ibv_alloc_pd(ida->verbs);
	struct ibv_cq *cqa = ibv_create_cq(ida->verbs, 16, NULL, NULL, 0);
	uint8_t *bufa = calloc(1, SIZE);
	CHECK(pda && cqa && bufa, "A's resources");
	struct ibv_mr *mra = ibv_reg_mr(pda, bufa, SIZE, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mra, "A's region");
	for (int i = 0; i < SIZE; i++)
		bufa[i] = (uint8_t)(i * 7 + 1);
	struct ibv_qp_init_attr qa = {.send_cq = cqa, .recv_cq = cqa, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 8, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(rdma_create_qp(ida, pda, &qa) == 0, "A's QP");
	CHECK(rdma_connect(ida, NULL) == 0, "connect");
	idb = tl_request(chb);
	struct ibv_qp_init_attr qb = qa;
	qb.send_cq = qb.recv_cq = cqb;
	CHECK(rdma_create_qp(idb, pdb, &qb) == 0, "B's QP");
	CHECK(rdma_accept(idb, NULL) == 0, "accept");
	tl_established(cha, chb);
	OK("connect");

	/* A type 2 window over [1024, +2048) of B's region. */
	uint32_t rkey2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr bind = {.wr_id = 1, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED};
	bind.bind_mw.mw = mw2;
	bind.bind_mw.rkey = rkey2;
	bind.bind_mw.bind_info = (struct ibv_mw_bind_info){mrb, (uintptr_t)bufb + 1024, 2048,
							   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
	tl_want(post_one(idb->qp, cqb, &bind), 1, IBV_WC_BIND_MW, IBV_WC_SUCCESS);
	struct ibv_sge sa = {(uintptr_t)bufa, 500, mra->lkey};
	struct ibv_send_wr w = {.wr_id = 2, .sg_list = &sa, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED};
	w.wr.rdma.remote_addr = (uintptr_t)bufb + 1124;
	w.wr.rdma.rkey = rkey2;
	tl_want(post_one(ida->qp, cqa, &w), 2, IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS);
	struct ibv_sge sr = {(uintptr_t)bufa + 4096, 500, mra->lkey};
	struct ibv_send_wr r = {.wr_id = 3, .sg_list = &sr, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				.send_flags = IBV_SEND_SIGNALED};
	r.wr.rdma.remote_addr = (uintptr_t)bufb + 1124;
	r.wr.rdma.rkey = rkey2;
	tl_want(post_one(ida->qp, cqa, &r), 3, IBV_WC_RDMA_READ, IBV_WC_SUCCESS);
	/* The Write completed once with TCP; B served the Read after placing
	 * it (one stream), so its bytes are there now. */
	CHECK(!memcmp(bufb + 1124, bufa, 500), "the Write through the window landed elsewhere");
	for (int i = 0; i < 1124; i++)
		CHECK(bufb[i] == 0, "byte %d before the Write's target changed", i);
	CHECK(!memcmp(bufa + 4096, bufa, 500), "the Read through the window read other bytes");
	OK("type 2 bind write read");

	/* A type 1 window by ibv_bind_mw: read-only over the first 256
	 * bytes; a type 2 window is refused. */
	uint32_t old1 = mw1->rkey;
	struct ibv_mw_bind b1 = {.wr_id = 4, .send_flags = IBV_SEND_SIGNALED,
				 .bind_info = {mrb, (uintptr_t)bufb, 256, IBV_ACCESS_REMOTE_READ}};
	CHECK(ibv_bind_mw(idb->qp, mw1, &b1) == 0, "ibv_bind_mw");
	CHECK(mw1->rkey == ibv_inc_rkey(old1), "type 1 rkey 0x%08x, want 0x%08x", mw1->rkey, ibv_inc_rkey(old1));
	tl_want(tl_poll(cqb), 4, IBV_WC_BIND_MW, IBV_WC_SUCCESS);
	sr.length = 8;
	r.wr_id = 5;
	r.wr.rdma.remote_addr = (uintptr_t)bufb + 248;
	r.wr.rdma.rkey = mw1->rkey;
	tl_want(post_one(ida->qp, cqa, &r), 5, IBV_WC_RDMA_READ, IBV_WC_SUCCESS);
	CHECK(ibv_bind_mw(idb->qp, mw2, &b1) == EINVAL, "ibv_bind_mw of a type 2 window");
	OK("type 1 ibv_bind_mw");

	/* A's Send with Invalidate of the type 2 window. */
	struct ibv_sge rs = {(uintptr_t)bufb + 6000, 64, mrb->lkey};
	struct ibv_recv_wr rw = {.wr_id = 6, .sg_list = &rs, .num_sge = 1}, *rbad = NULL;
	CHECK(ibv_post_recv(idb->qp, &rw, &rbad) == 0, "post recv");
	sa.length = 10;
	struct ibv_send_wr si = {.wr_id = 7, .sg_list = &sa, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
				 .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = rkey2};
	tl_want(post_one(ida->qp, cqa, &si), 7, IBV_WC_SEND, IBV_WC_SUCCESS);
	struct ibv_wc wc = tl_poll(cqb);
	tl_want(wc, 6, IBV_WC_RECV, IBV_WC_SUCCESS);
	CHECK((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == rkey2, "receive flags 0x%x, invalidated 0x%08x",
	      wc.wc_flags, wc.invalidated_rkey);
	OK("remote invalidate");

	/* Bound again under a new key, then IBV_WR_LOCAL_INV. */
	uint32_t rkey3 = ibv_inc_rkey(rkey2);
	bind.wr_id = 8;
	bind.bind_mw.rkey = rkey3;
	struct ibv_send_wr li = {.wr_id = 9, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED,
				 .invalidate_rkey = rkey3};
	bind.next = &li;
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(idb->qp, &bind, &bad) == 0, "post bind and local invalidate");
	tl_want(tl_poll(cqb), 8, IBV_WC_BIND_MW, IBV_WC_SUCCESS);
	tl_want(tl_poll(cqb), 9, IBV_WC_LOCAL_INV, IBV_WC_SUCCESS);
	OK("local invalidate");

	CHECK(ibv_dereg_mr(mrb) == EBUSY, "ibv_dereg_mr of a region with a window bound");
	OK("dereg mr with window bound");

	/* A's Write to the invalidated window: nothing lands; B's Terminate
	 * ends A's stream, so A's Read behind it completes in error. */
	uint8_t *snap = malloc(SIZE);
	CHECK(snap, "snapshot");
	memcpy(snap, bufb, SIZE);
	sa.length = 100;
	w.wr_id = 10;
	w.wr.rdma.remote_addr = (uintptr_t)bufb + 1024;
	w.wr.rdma.rkey = rkey3;
	r.wr_id = 11;
	w.next = &r;
	CHECK(ibv_post_send(ida->qp, &w, &bad) == 0, "post Write and Read");
	struct ibv_wc wa = tl_poll(cqa), wb = tl_poll(cqa);
	CHECK(wa.wr_id == 10 && wb.wr_id == 11 && wb.status != IBV_WC_SUCCESS, "Write %s, Read %s",
	      ibv_wc_status_str(wa.status), ibv_wc_status_str(wb.status));
	CHECK(!memcmp(snap, bufb, SIZE), "the Write to the invalidated window landed");
	free(snap);
	OK("write after local invalidate refused");

	CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0, "ibv_dealloc_mw");
	CHECK(ibv_dereg_mr(mrb) == 0, "ibv_dereg_mr once the windows are gone");
	OK("dealloc mw");

	rdma_disconnect(ida);
	rdma_destroy_qp(ida);
	rdma_destroy_qp(idb);
	CHECK(ibv_dereg_mr(mra) == 0, "dereg A's region");
	free(bufa);
	free(bufb);
	puts("PASS");
	return 0;
}
