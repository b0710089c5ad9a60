/* siwtun-ctest: libsiwtun's own test program, an ordinary libibverbs and
 * librdmacm program (built with -fsanitize=address,undefined against the
 * system libraries, run with libsiwtun preloaded) on two siwtun daemons:
 *
 *   siwtun-ctest DEV_A DEV_B [PORT]
 *
 * DEV_A connects to a listener on DEV_B. It covers what rping and perftest
 * do not: device queries (P_Key index, device index, the GID table), the
 * verbs the library refuses (EOPNOTSUPP: XRC and tag-matching SRQs, address handles, memory
 * windows, ECE, imports, dma-buf, UD), the ports and
 * addresses of connected ids, rdma_notify, rdma_get_devices, rdma_reject
 * with private data reaching the REJECTED side, every memory-registration
 * case (malloc'd, static, stack, unaligned, two regions on one page, the
 * same buffer twice, an IOVA other than the address), each written by the
 * peer's RDMA WRITE and read back by RDMA READ with guard bytes around it
 * checked, Send/Receive, completion channels with poll(2) (solicited-only
 * included), RDMA Write and Send with Immediate Data (RFC 7306: imm_data,
 * IBV_WC_WITH_IMM, IBV_WC_RECV_RDMA_WITH_IMM) and atomics (Fetch-and-Add,
 * Compare-and-Swap, atomic_cap; with --no-imm, against a daemon with
 * --rdmap-ext off, the posts' EOPNOTSUPP instead),
 * ibv_query_qp, ibv_rereg_mr (new memory, access, PD), a QP moved to ERR,
 * back to RESET and connected again, and the flush of posted receives on disconnect
 * (with --terminate: on the Terminate a Write to a bad rkey draws, after
 * IBV_EVENT_QP_FATAL on both sides). With --rsockets DEV_A DEV_B PORT:
 * libsiwtun's rsockets (see rsockets below). The run on two devices is a
 * table of named cases (cases[] below), run in order, each sharing the
 * connection and memory the ones before it set up; --list prints the
 * cases (name, tab, what it checks) a run with the same flags reports.
 * Prints "ok NAME" per case; exits 1 at the first failure. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <unistd.h>

#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>

#include "testlib.h"

#define GUARD 64
#define GUARD_BYTE 0xA5

/* One registration case: LEN bytes at P, with GUARD bytes before and after
 * that nothing may touch. */
struct mcase {
	const char *name;
	uint8_t *p;
	size_t len;
	struct ibv_mr *mr;
};

static void fill_guards(struct mcase *m)
{
	memset(m->p - GUARD, GUARD_BYTE, GUARD);
	memset(m->p + m->len, GUARD_BYTE, GUARD);
}

static void check_guards(struct mcase *m)
{
	for (int i = 0; i < GUARD; i++) {
		CHECK(m->p[-GUARD + i] == GUARD_BYTE, "%s: guard byte %d before the region changed", m->name, GUARD - i);
		CHECK(m->p[m->len + i] == GUARD_BYTE, "%s: guard byte %d after the region changed", m->name, i);
	}
}

static uint8_t static_buf[GUARD + 1000 + GUARD];

/* state_of is the QP's state as ibv_query_qp gives it. */
static enum ibv_qp_state state_of(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	CHECK(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) == 0, "query qp");
	CHECK(a.qp_state == qp->state, "ibv_query_qp's state %d, the QP's field %d", a.qp_state, qp->state);
	return a.qp_state;
}

/* The atomic cases' target word on B and result buffers on A. */
enum { ATOM_N = 40 };
struct atom {
	uint64_t *tbuf, *word, *res, sum;
	struct ibv_mr *tmr, *rmr;
};

/* fix is what the cases of one run share: the devices, the connection A
 * makes to B's listener and its queues, B's registered memory and A's
 * source and read-back buffers. */
struct fix {
	const char *dev_a, *dev_b;
	int port, terminate;
	struct ibv_context *ca, *cb;
	struct sockaddr_in addr_a, addr_b;
	/* The rdma_cm semantics cases' listener, on a port its bind chose. */
	struct rdma_event_channel *scha, *schb;
	struct rdma_cm_id *slid;
	uint16_t sport;
	/* The connection. */
	struct rdma_event_channel *cha, *chb;
	struct rdma_cm_id *lid, *aid, *bid;
	struct ibv_pd *pda, *pdb;
	struct ibv_comp_channel *cca, *ccb;
	struct ibv_cq *cqa, *cqb;
	struct ibv_qp *qpa, *qpb;
	struct ibv_qp_init_attr qa;
	/* B's memory (mem[0] is the Send/Receive buffer after registration). */
	uint8_t *heap, *shared, *odd, *stack;
	struct mcase mem[6];
	struct ibv_mr *twice;
	uint8_t *src, *back;
	struct ibv_mr *srcmr, *backmr;
	struct atom atom;
};

static void case_queries(struct fix *f)
{
	struct ibv_context *c = f->ca;
	struct ibv_device_attr da;
	CHECK(ibv_query_device(c, &da) == 0, "query device");
	CHECK(da.vendor_id == 0x736977 && da.phys_port_cnt == 1 && da.max_sge >= 1 && da.max_qp_wr > 0, "device attr");
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(c, 1, &pa) == 0, "query port");
	CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.gid_tbl_len == 1, "port attr");
	CHECK(ibv_query_port(c, 2, &pa) == EINVAL, "port 2");
	__be16 pkey;
	CHECK(ibv_query_pkey(c, 1, 0, &pkey) == 0 && pkey == htobe16(0xffff), "pkey");
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(c, NULL, &dx) == 0 && dx.orig_attr.vendor_id == 0x736977, "query device ex");
	CHECK(dx.phys_port_cnt_ex == dx.orig_attr.phys_port_cnt, "phys_port_cnt_ex %u, phys_port_cnt %u", dx.phys_port_cnt_ex,
	      dx.orig_attr.phys_port_cnt);
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(c, 1, 0, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_IB, "query gid ex");
	CHECK(ibv_get_pkey_index(c, 1, htobe16(0xffff)) == 0, "pkey index of the default P_Key");
	CHECK(ibv_get_pkey_index(c, 1, htobe16(0x8001)) == -1 && ibv_get_pkey_index(c, 2, htobe16(0xffff)) == -1,
	      "pkey index of a P_Key or port the device lacks");
	/* The GID table: one entry, the RNIC's address, on the TUN device of
	 * the same name (in this namespace). */
	union ibv_gid gid;
	CHECK(ibv_query_gid(c, 1, 0, &gid) == 0, "query gid");
	/* iWARP's GID: a MAC (locally administered, unicast), then zeros;
	 * the node GUID is the MAC's modified EUI-64, as siw's. */
	static const uint8_t zeros[10];
	uint8_t eui[8] = {gid.raw[0] ^ 2, gid.raw[1], gid.raw[2], 0xff, 0xfe, gid.raw[3], gid.raw[4], gid.raw[5]};
	CHECK((gid.raw[0] & 3) == 2 && !memcmp(gid.raw + 6, zeros, 10), "GID is not a MAC and zeros");
	CHECK(!memcmp(&da.node_guid, eui, 8), "node GUID is not the EUI-64 of the GID's MAC");
	struct ibv_gid_entry tab[4];
	memset(tab, 0x5a, sizeof(tab));
	ssize_t ng = ibv_query_gid_table(c, tab, 4, 0);
	CHECK(ng == 1, "gid table: %zd entries", ng);
	unsigned ifx = if_nametoindex(ibv_get_device_name(c->device));
	CHECK(!memcmp(&tab[0].gid, &gid, sizeof(gid)) && tab[0].gid_index == 0 && tab[0].port_num == 1 &&
	      tab[0].gid_type == IBV_GID_TYPE_IB && ifx != 0 && tab[0].ndev_ifindex == ifx,
	      "gid table entry: index %u port %u type %u ifindex %u (want %u)", tab[0].gid_index, tab[0].port_num,
	      tab[0].gid_type, tab[0].ndev_ifindex, ifx);
	CHECK(tab[1].gid_index == 0x5a5a5a5a, "gid table wrote past its one entry");
	CHECK(ibv_query_gid_table(c, tab, 0, 0) == -EINVAL && ibv_query_gid_table(c, tab, 4, 1) == -EINVAL,
	      "gid table: no room, or unknown flags");
}

static void case_unsupported(struct fix *f)
{
	struct ibv_context *c = f->aid->verbs;
	struct ibv_pd *pd = f->pda;
	struct ibv_cq *cq = f->cqa;
	struct ibv_ah_attr aa = {.port_num = 1};
	errno = 0;
	CHECK(!ibv_create_ah(pd, &aa) && errno == EOPNOTSUPP, "create ah");
	/* Memory windows are supported (siwtun-mwtest); a type libibverbs
	 * does not define is EINVAL. */
	errno = 0;
	CHECK(!ibv_alloc_mw(pd, (enum ibv_mw_type)3) && errno == EINVAL, "alloc mw of type 3");
	CHECK(ibv_resize_cq(cq, 64) == EOPNOTSUPP, "resize cq");
	struct ibv_cq_init_attr_ex cx = {.cqe = 4};
	errno = 0;
	CHECK(!ibv_create_cq_ex(c, &cx) && errno == EOPNOTSUPP, "create cq ex");
	struct ibv_qp_init_attr ud = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD, .cap = {1, 1, 1, 1, 0}};
	errno = 0;
	CHECK(!ibv_create_qp(pd, &ud) && errno == EOPNOTSUPP, "UD QP");
	union ibv_gid g = {0};
	CHECK(ibv_attach_mcast(NULL, &g, 0) == EOPNOTSUPP, "attach mcast");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, &g, sizeof(g), IBV_ACCESS_ZERO_BASED) && errno == EOPNOTSUPP, "zero-based MR");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, &g, sizeof(g), IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL, "REMOTE_WRITE without LOCAL_WRITE");

	/* SRQs other than basic ones (siwtun-srqtest tests those): the
	 * tag-matching and XRC kinds, through the context's (absent)
	 * create_srq_ex op and rdma_create_srq_ex. */
	struct ibv_srq_init_attr_ex sx = {.attr = {.max_wr = 4, .max_sge = 1},
					  .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ,
					  .srq_type = IBV_SRQT_TM, .pd = pd, .cq = cq};
	errno = 0;
	CHECK(!ibv_create_srq_ex(c, &sx) && errno == EOPNOTSUPP, "create srq ex");
	struct rdma_cm_id *sid;
	CHECK(rdma_create_id(NULL, &sid, NULL, RDMA_PS_TCP) == 0, "create id");
	sx.srq_type = IBV_SRQT_XRC;
	errno = 0;
	CHECK(rdma_create_srq_ex(sid, &sx) == -1 && errno == EOPNOTSUPP, "rdma_create_srq_ex XRC");
	CHECK(rdma_destroy_id(sid) == 0, "destroy id");

	/* Importing another process's objects: there is no kernel object to
	 * share. */
	errno = 0;
	CHECK(!ibv_import_device(c->cmd_fd) && errno == EOPNOTSUPP, "import device");
	errno = 0;
	CHECK(!ibv_import_pd(c, 1) && errno == EOPNOTSUPP, "import pd");
	errno = 0;
	CHECK(!ibv_import_mr(pd, 1) && errno == EOPNOTSUPP, "import mr");
	errno = 0;
	CHECK(!ibv_import_dm(c, 1) && errno == EOPNOTSUPP, "import dm");

	/* dma-buf memory (device memory of a GPU) is not ordinary memory a
	 * software RNIC can map. */
	errno = 0;
	CHECK(!ibv_reg_dmabuf_mr(pd, 0, 4096, 0, c->async_fd, IBV_ACCESS_LOCAL_WRITE) && errno == EOPNOTSUPP, "reg dmabuf mr");
	uint8_t mac[6];
	uint16_t vid;
	CHECK(ibv_resolve_eth_l2_from_gid(c, &aa, mac, &vid) == EOPNOTSUPP, "resolve eth l2");
}

/* qp-reuse: a QP A creates itself (ibv_create_qp) connects through
 * an id by its number, is moved to ERR (its posted receive flushed, the
 * peer disconnected), back to RESET and INIT, and connects again through
 * a new id to a new peer QP, where a Send lands in a receive posted after
 * the reset; ibv_query_qp tells each state. */
static void case_qp_reuse(struct fix *f)
{
	struct rdma_event_channel *cha = f->cha, *chb = f->chb;
	struct ibv_context *ctxa = f->aid->verbs;
	const struct sockaddr_in *addr_a = &f->addr_a;
	struct sockaddr_in addr_b = f->addr_b;
	int port = f->port + 50;
	addr_b.sin_port = htons((uint16_t)port);
	struct rdma_cm_id *lid;
	CHECK(rdma_create_id(chb, &lid, NULL, RDMA_PS_TCP) == 0, "create listen id");
	CHECK(rdma_bind_addr(lid, (struct sockaddr *)&addr_b) == 0 && rdma_listen(lid, 2) == 0, "listen");
	struct ibv_pd *pd = ibv_alloc_pd(ctxa), *pdb = ibv_alloc_pd(lid->verbs);
	struct ibv_cq *cq = ibv_create_cq(ctxa, 16, NULL, NULL, 0), *cqb = ibv_create_cq(lid->verbs, 16, NULL, NULL, 0);
	char *buf = calloc(1, 256), *bbuf = calloc(1, 256);
	CHECK(pd && pdb && cq && cqb && buf && bbuf, "reuse resources");
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 256, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *bmr = ibv_reg_mr(pdb, bbuf, 256, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && bmr, "reuse regions");
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	/* A new iWARP QP queries as INIT (siw's IDLE); its state field says
	 * RESET until then, as libibverbs sets it. */
	CHECK(qp && qp->state == IBV_QPS_RESET && state_of(qp) == IBV_QPS_INIT, "self-created QP");
	struct ibv_qp_attr st = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	CHECK(ibv_modify_qp(qp, &st, IBV_QP_STATE) == 0 && state_of(qp) == IBV_QPS_INIT, "INIT");
	struct ibv_sge rs = {(uintptr_t)buf, 256, mr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 41, .sg_list = &rs, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(qp, &rw, &rbad) == 0, "post recv");
	for (int round = 0; round < 2; round++) {
		struct rdma_cm_id *aid, *bid;
		CHECK(rdma_create_id(cha, &aid, NULL, RDMA_PS_TCP) == 0, "create id");
		tl_resolve(aid, addr_a, &addr_b);
		struct rdma_conn_param cp = {.qp_num = qp->qp_num, .responder_resources = 1, .initiator_depth = 1};
		CHECK(rdma_connect(aid, &cp) == 0, "connect the self-created QP (round %d)", round);
		bid = tl_request(chb);
		struct ibv_qp_init_attr qb = {.send_cq = cqb, .recv_cq = cqb, .qp_type = IBV_QPT_RC,
					      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
		CHECK(rdma_create_qp(bid, pdb, &qb) == 0 && rdma_accept(bid, NULL) == 0, "accept");
		tl_ack_event(cha, RDMA_CM_EVENT_ESTABLISHED);
		tl_ack_event(chb, RDMA_CM_EVENT_ESTABLISHED);
		CHECK(state_of(qp) == IBV_QPS_RTS, "RTS after connecting (round %d)", round);
		/* A Send from B into the receive posted on A. */
		char msg[32];
		snprintf(msg, sizeof(msg), "round %d", round);
		struct ibv_sge ss = {(uintptr_t)msg, (uint32_t)strlen(msg) + 1, 0};
		struct ibv_send_wr sw = {.wr_id = 42, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE}, *sbad;
		CHECK(ibv_post_send(bid->qp, &sw, &sbad) == 0, "post send");
		tl_expect(cqb, IBV_WC_SEND, IBV_WC_SUCCESS, 42, NULL);
		struct ibv_wc wc;
		tl_expect(cq, IBV_WC_RECV, IBV_WC_SUCCESS, 41, &wc);
		CHECK(wc.qp_num == qp->qp_num && !strcmp(buf, msg), "round %d: received %s", round, buf);
		if (round == 1) {
			CHECK(rdma_disconnect(aid) == 0, "disconnect");
			tl_ack_event(cha, RDMA_CM_EVENT_DISCONNECTED);
			tl_ack_event(chb, RDMA_CM_EVENT_DISCONNECTED);
		} else {
			/* ERR by hand: the posted receive is flushed, the peer sees
			 * the connection end. */
			rw.wr_id = 43;
			CHECK(ibv_post_recv(qp, &rw, &rbad) == 0, "post recv");
			st.qp_state = IBV_QPS_ERR;
			CHECK(ibv_modify_qp(qp, &st, IBV_QP_STATE) == 0 && state_of(qp) == IBV_QPS_ERR, "ERR");
			tl_expect(cq, IBV_WC_RECV, IBV_WC_WR_FLUSH_ERR, 43, NULL);
			tl_ack_event(cha, RDMA_CM_EVENT_DISCONNECTED);
			tl_ack_event(chb, RDMA_CM_EVENT_DISCONNECTED);
			/* Back to RESET and INIT for the next round. */
			st.qp_state = IBV_QPS_RESET;
			CHECK(ibv_modify_qp(qp, &st, IBV_QP_STATE) == 0 && state_of(qp) == IBV_QPS_RESET, "RESET");
			CHECK(ibv_post_recv(qp, &rw, &rbad) == EINVAL && rbad == &rw, "post recv in RESET");
			st.qp_state = IBV_QPS_INIT;
			CHECK(ibv_modify_qp(qp, &st, IBV_QP_STATE) == 0 && state_of(qp) == IBV_QPS_INIT, "INIT again");
			rw.wr_id = 41;
			memset(buf, 0, 256);
			CHECK(ibv_post_recv(qp, &rw, &rbad) == 0, "post recv after the reset");
		}
		CHECK(rdma_destroy_id(aid) == 0, "destroy id");
		rdma_destroy_qp(bid);
		CHECK(rdma_destroy_id(bid) == 0, "destroy id");
	}
	struct ibv_wc wc;
	while (ibv_poll_cq(cqb, 1, &wc) > 0)
		CHECK(wc.status == IBV_WC_WR_FLUSH_ERR, "peer completion %s", ibv_wc_status_str(wc.status));
	CHECK(ibv_destroy_qp(qp) == 0, "destroy the reused QP");
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(bmr) == 0 && ibv_destroy_cq(cq) == 0 && ibv_destroy_cq(cqb) == 0 &&
	      ibv_dealloc_pd(pd) == 0 && ibv_dealloc_pd(pdb) == 0 && rdma_destroy_id(lid) == 0,
	      "reuse teardown");
	free(buf);
	free(bbuf);
}

/* rereg-mr: ibv_rereg_mr on a region of B that A writes and reads:
 * moved to other memory (CHANGE_TRANSLATION) the rkey stays and A's Write
 * lands in the new memory only; its access changed (CHANGE_ACCESS) A can
 * still read it; moved to another PD and back (CHANGE_PD; the other PD
 * cannot go while it holds the region); bad input refused with
 * IBV_REREG_MR_ERR_INPUT, the region unchanged. */
static void case_rereg(struct fix *f)
{
	struct ibv_qp *qpa = f->qpa;
	struct ibv_cq *cqa = f->cqa;
	struct ibv_pd *pdb = f->pdb;
	struct ibv_mr *srcmr = f->srcmr, *backmr = f->backmr;
	uint8_t *src = f->src, *back = f->back;
	uint8_t *m1 = calloc(1, 512), *m2 = calloc(1, 512);
	CHECK(m1 && m2, "malloc");
	struct ibv_mr *mr = ibv_reg_mr(pdb, m1, 512, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "reg");
	uint32_t rkey = mr->rkey;
	struct ibv_send_wr *bad;
	/* write writes n bytes of tag at offset 10 of the region's memory at
	 * base, then reads the region's first n+10 bytes back. */
#define REREG_RW(base, tag, n)                                                                                     \
	do {                                                                                                        \
		memset(src, (tag), (n));                                                                            \
		struct ibv_sge ws_ = {(uintptr_t)src, (n), srcmr->lkey};                                            \
		struct ibv_send_wr w_ = {.wr_id = 900, .sg_list = &ws_, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, \
					 .send_flags = IBV_SEND_SIGNALED,                                           \
					 .wr = {.rdma = {(uintptr_t)(base) + 10, mr->rkey}}};                       \
		CHECK(ibv_post_send(qpa, &w_, &bad) == 0, "post write");                                            \
		tl_expect(cqa, IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS, 900, NULL);                                        \
		struct ibv_sge rs_ = {(uintptr_t)back, (n) + 10, backmr->lkey};                                     \
		struct ibv_send_wr r_ = {.wr_id = 901, .sg_list = &rs_, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,  \
					 .send_flags = IBV_SEND_SIGNALED, .wr = {.rdma = {(uintptr_t)(base), mr->rkey}}}; \
		CHECK(ibv_post_send(qpa, &r_, &bad) == 0, "post read");                                             \
		tl_expect(cqa, IBV_WC_RDMA_READ, IBV_WC_SUCCESS, 901, NULL);                                         \
	} while (0)
	REREG_RW(m1, 0x11, 100);
	CHECK(m1[10] == 0x11 && m1[109] == 0x11 && m1[110] == 0 && back[10] == 0x11, "first write");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, m2, 256, 0) == 0, "rereg translation");
	CHECK(mr->rkey == rkey && mr->addr == m2 && mr->length == 256 && mr->pd == pdb, "region after rereg");
	REREG_RW(m2, 0x22, 100);
	CHECK(m2[10] == 0x22 && m2[109] == 0x22 && back[10] == 0x22 && m1[10] == 0x11, "write after rereg: new %x, old %x",
	      m2[10], m1[10]);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
										IBV_ACCESS_REMOTE_WRITE) == 0,
	      "rereg access");
	REREG_RW(m2, 0x33, 50);
	CHECK(m2[10] == 0x33 && back[59] == 0x33, "write after access rereg");
	struct ibv_pd *pd2 = ibv_alloc_pd(pdb->context);
	CHECK(pd2, "alloc pd");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0 && mr->pd == pd2, "rereg pd");
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "dealloc of a PD holding a region");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pdb, NULL, 0, 0) == 0 && mr->pd == pdb, "rereg pd back");
	CHECK(ibv_dealloc_pd(pd2) == 0, "dealloc pd");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "rereg without flags");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "rereg to no memory");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE) == IBV_REREG_MR_ERR_INPUT &&
		      errno == EINVAL,
	      "rereg to REMOTE_WRITE without LOCAL_WRITE");
	REREG_RW(m2, 0x44, 20);
	CHECK(m2[10] == 0x44 && mr->addr == m2, "the region after refused rereg calls");
#undef REREG_RW
	CHECK(ibv_dereg_mr(mr) == 0, "dereg");
	free(m1);
	free(m2);
}

/* write-with-imm: RDMA Write with Immediate Data from A into B's region
 * mem[0], each consuming one of B's receives and completing it as
 * IBV_WC_RECV_RDMA_WITH_IMM with the immediate value (in network order, as
 * posted) and the Write's length, the data in place by then; zero-length
 * ones among them. */
static void case_write_imm(struct fix *f)
{
	struct mcase *m = &f->mem[0];
	uint8_t *src = f->src;
	struct ibv_sge rs = {(uintptr_t)m->p, (uint32_t)m->len, m->mr->lkey};
	struct ibv_recv_wr rw = {.sg_list = &rs, .num_sge = 1}, *rbad;
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	for (int i = 0; i < 40; i++) {
		uint32_t len = i % 5 == 0 ? 0 : (uint32_t)((i * 997) % (int)m->len) + 1;
		for (uint32_t k = 0; k < len; k++)
			src[k] = (uint8_t)(k * 13 + (uint32_t)i);
		rw.wr_id = 600 + (uint64_t)i;
		CHECK(ibv_post_recv(f->qpb, &rw, &rbad) == 0, "post recv for write with imm %d", i);
		struct ibv_sge sge = {(uintptr_t)src, len, f->srcmr->lkey};
		struct ibv_send_wr wr = {.wr_id = 700 + (uint64_t)i, .sg_list = &sge, .num_sge = len ? 1 : 0,
					 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
					 .imm_data = htonl(0xc0de0000u + (uint32_t)i), .wr = {.rdma = {(uintptr_t)m->p, m->mr->rkey}}};
		if (i % 3 == 1)
			wr.send_flags |= IBV_SEND_SOLICITED;
		CHECK(ibv_post_send(f->qpa, &wr, &bad) == 0, "post write with imm %d", i);
		tl_expect(f->cqb, IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_SUCCESS, rw.wr_id, &wc);
		CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htonl(0xc0de0000u + (uint32_t)i) && wc.byte_len == len &&
			      wc.qp_num == f->qpb->qp_num,
		      "write with imm %d: flags 0x%x imm 0x%x len %u", i, wc.wc_flags, ntohl(wc.imm_data), wc.byte_len);
		CHECK(!memcmp(m->p, src, len), "write with imm %d: data not placed before its completion", i);
		tl_expect(f->cqa, IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS, wr.wr_id, NULL);
	}
	check_guards(m);
}

/* send-with-imm: Send with Immediate Data from A, completing on B as
 * IBV_WC_RECV with IBV_WC_WITH_IMM and the data in the receive's buffer. */
static void case_send_imm(struct fix *f)
{
	struct mcase *m = &f->mem[0];
	struct ibv_sge rs = {(uintptr_t)m->p, (uint32_t)m->len, m->mr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 650, .sg_list = &rs, .num_sge = 1}, *rbad;
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	static const char note[] = "send with immediate data";
	memset(m->p, 0, sizeof(note));
	CHECK(ibv_post_recv(f->qpb, &rw, &rbad) == 0, "post recv for send with imm");
	struct ibv_sge ns = {(uintptr_t)note, sizeof(note), 0};
	struct ibv_send_wr sw = {.wr_id = 750, .sg_list = &ns, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
				 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE, .imm_data = htonl(0x5157u)};
	CHECK(ibv_post_send(f->qpa, &sw, &bad) == 0, "post send with imm");
	tl_expect(f->cqb, IBV_WC_RECV, IBV_WC_SUCCESS, 650, &wc);
	CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htonl(0x5157u) && wc.byte_len == sizeof(note) &&
		      !memcmp(m->p, note, sizeof(note)),
	      "send with imm: flags 0x%x imm 0x%x len %u", wc.wc_flags, ntohl(wc.imm_data), wc.byte_len);
	tl_expect(f->cqa, IBV_WC_SEND, IBV_WC_SUCCESS, 750, NULL);
	check_guards(m);
}

/* imm-refused: toward a peer without RFC 7306 (--rdmap-ext off) both
 * requests with immediate data fail at post time with EOPNOTSUPP, bad_wr
 * naming them, and nothing completes. */
static void case_no_imm(struct fix *f)
{
	struct ibv_mr *srcmr = f->srcmr;
	struct mcase *m = &f->mem[0];
	const enum ibv_wr_opcode ops[2] = {IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND_WITH_IMM};
	for (int k = 0; k < 2; k++) {
		struct ibv_sge sge = {srcmr->addr ? (uintptr_t)srcmr->addr : 0, 8, srcmr->lkey};
		struct ibv_send_wr wr = {.wr_id = 800 + (uint64_t)k, .sg_list = &sge, .num_sge = 1, .opcode = ops[k],
					 .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(1),
					 .wr = {.rdma = {(uintptr_t)m->p, m->mr->rkey}}}, *bad = NULL;
		CHECK(ibv_post_send(f->qpa, &wr, &bad) == EOPNOTSUPP && bad == &wr, "opcode %d toward a peer without RFC 7306",
		      ops[k]);
	}
	struct ibv_wc wc;
	usleep(100000);
	CHECK(ibv_poll_cq(f->cqa, 1, &wc) == 0, "a refused request completed");
}

/* atomic_wr is an atomic request of A on the target word. */
static struct ibv_send_wr atomic_wr(struct atom *at, struct ibv_sge *sge, uint64_t id, enum ibv_wr_opcode op, int flags)
{
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = sge, .num_sge = 1, .opcode = op, .send_flags = (unsigned)flags};
	wr.wr.atomic.remote_addr = (uintptr_t)at->word;
	wr.wr.atomic.rkey = at->tmr->rkey;
	return wr;
}

/* atomic-fetch-add: RFC 7306 atomics from A on a word of B's region (both
 * daemons report IBV_ATOMIC_HCA): Fetch-and-Adds returning the word's
 * value before each into A's 8-byte result buffers (IBV_WC_FETCH_ADD,
 * byte_len 8), the word's sum checked in B's memory. */
static void case_fetch_add(struct fix *f)
{
	struct atom *at = &f->atom;
	struct ibv_device_attr da;
	CHECK(ibv_query_device(f->pda->context, &da) == 0 && da.atomic_cap == IBV_ATOMIC_HCA, "A's atomic_cap %d", da.atomic_cap);
	CHECK(ibv_query_device(f->pdb->context, &da) == 0 && da.atomic_cap == IBV_ATOMIC_HCA, "B's atomic_cap %d", da.atomic_cap);
	at->tbuf = aligned_alloc(64, 64 + 64 + 64);
	CHECK(at->tbuf, "aligned_alloc");
	memset(at->tbuf, GUARD_BYTE, 192);
	at->word = at->tbuf + 8 + 1; /* the region is tbuf[8..15]; the word its second */
	memset(at->tbuf + 8, 0, 64);
	*at->word = 10;
	at->tmr = ibv_reg_mr(f->pdb, at->tbuf + 8, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(at->tmr, "register the atomic target");
	at->res = calloc(ATOM_N, 8);
	CHECK(at->res, "calloc");
	at->rmr = ibv_reg_mr(f->pda, at->res, ATOM_N * 8, IBV_ACCESS_LOCAL_WRITE);
	CHECK(at->rmr, "register the results");
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	at->sum = 10;
	for (int i = 0; i < ATOM_N; i++) {
		struct ibv_sge sge = {(uintptr_t)&at->res[i], 8, at->rmr->lkey};
		struct ibv_send_wr wr = atomic_wr(at, &sge, 900 + (uint64_t)i, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_SEND_SIGNALED);
		wr.wr.atomic.compare_add = (uint64_t)i;
		CHECK(ibv_post_send(f->qpa, &wr, &bad) == 0, "post fetch-and-add %d", i);
		if (i % 8 == 7 || i == ATOM_N - 1)
			for (int k = i - i % 8; k <= i; k++) {
				tl_expect(f->cqa, IBV_WC_FETCH_ADD, IBV_WC_SUCCESS, 900 + (uint64_t)k, &wc);
				CHECK(wc.byte_len == 8, "fetch-and-add %d: byte_len %u", k, wc.byte_len);
			}
	}
	for (int i = 0; i < ATOM_N; i++) {
		CHECK(at->res[i] == at->sum, "fetch-and-add %d returned %llu, want %llu", i, (unsigned long long)at->res[i],
		      (unsigned long long)at->sum);
		at->sum += (uint64_t)i;
	}
	CHECK(__atomic_load_n(at->word, __ATOMIC_SEQ_CST) == at->sum, "word %llu, want %llu", (unsigned long long)*at->word,
	      (unsigned long long)at->sum);
}

/* atomic-cmp-swap: a Compare-and-Swap that stores and one that does not
 * (IBV_WC_COMP_SWAP, byte_len 8), the word checked in B's memory and the
 * bytes around it untouched. */
static void case_cmp_swap(struct fix *f)
{
	struct atom *at = &f->atom;
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	const uint64_t cmp[2] = {at->sum, at->sum}, swp[2] = {0x0123456789abcdefull, 7};
	for (int k = 0; k < 2; k++) {
		struct ibv_sge sge = {(uintptr_t)&at->res[k], 8, at->rmr->lkey};
		struct ibv_send_wr wr = atomic_wr(at, &sge, 990 + (uint64_t)k, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_SEND_SIGNALED);
		wr.wr.atomic.compare_add = cmp[k];
		wr.wr.atomic.swap = swp[k];
		CHECK(ibv_post_send(f->qpa, &wr, &bad) == 0, "post compare-and-swap %d", k);
		tl_expect(f->cqa, IBV_WC_COMP_SWAP, IBV_WC_SUCCESS, wr.wr_id, &wc);
		CHECK(wc.byte_len == 8, "compare-and-swap %d: byte_len %u", k, wc.byte_len);
	}
	CHECK(at->res[0] == at->sum && at->res[1] == swp[0], "compare-and-swap returned %llx %llx",
	      (unsigned long long)at->res[0], (unsigned long long)at->res[1]);
	CHECK(__atomic_load_n(at->word, __ATOMIC_SEQ_CST) == swp[0], "word %llx after compare-and-swap",
	      (unsigned long long)*at->word);
	const uint8_t *b = (const uint8_t *)at->tbuf;
	for (int i = 0; i < 192; i++)
		CHECK((i >= 72 && i < 80) || (i >= 64 && i < 128 ? b[i] == 0 : b[i] == GUARD_BYTE), "byte %d around the word", i);
}

/* atomic-post-errors: what the library refuses at post time (EINVAL: two
 * SGEs, a 4-byte result, inline) and registration (REMOTE_ATOMIC without
 * LOCAL_WRITE); nothing completes. */
static void case_atomic_errors(struct fix *f)
{
	struct atom *at = &f->atom;
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	struct ibv_sge two[2] = {{(uintptr_t)&at->res[0], 8, at->rmr->lkey}, {(uintptr_t)&at->res[1], 8, at->rmr->lkey}};
	struct ibv_send_wr w = atomic_wr(at, two, 999, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_SEND_SIGNALED);
	w.num_sge = 2;
	CHECK(ibv_post_send(f->qpa, &w, &bad) == EINVAL && bad == &w, "two SGEs");
	w.num_sge = 1;
	two[0].length = 4;
	CHECK(ibv_post_send(f->qpa, &w, &bad) == EINVAL && bad == &w, "a 4-byte result");
	two[0].length = 8;
	w.send_flags |= IBV_SEND_INLINE;
	CHECK(ibv_post_send(f->qpa, &w, &bad) == EINVAL && bad == &w, "inline atomic");
	errno = 0;
	CHECK(!ibv_reg_mr(f->pdb, at->tbuf + 8, 64, IBV_ACCESS_REMOTE_ATOMIC) && errno == EINVAL,
	      "REMOTE_ATOMIC without LOCAL_WRITE");
	usleep(50000);
	CHECK(ibv_poll_cq(f->cqa, 1, &wc) == 0, "a refused atomic completed");
}

/* atomic-unsignaled: perftest's way: every request with the same wr_id,
 * one in 16 signaled, more of them than the send queue holds (32): each
 * signaled completion frees the 16 requests up to it. */
static void case_atomic_unsignaled(struct fix *f)
{
	struct atom *at = &f->atom;
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	*at->word = 0;
	enum { M = 400, MOD = 16, DEPTH = 32 };
	int scnt = 0, ccnt = 0;
	while (ccnt < M) {
		while (scnt < M && scnt - ccnt < DEPTH) {
			struct ibv_sge sge = {(uintptr_t)&at->res[scnt % ATOM_N], 8, at->rmr->lkey};
			struct ibv_send_wr wr = atomic_wr(at, &sge, 0x5157, IBV_WR_ATOMIC_FETCH_AND_ADD,
							  (scnt + 1) % MOD == 0 ? IBV_SEND_SIGNALED : 0);
			wr.wr.atomic.compare_add = 1;
			CHECK(ibv_post_send(f->qpa, &wr, &bad) == 0, "post unsignaled fetch-and-add %d (%d completed)", scnt, ccnt);
			scnt++;
		}
		tl_expect(f->cqa, IBV_WC_FETCH_ADD, IBV_WC_SUCCESS, 0x5157, &wc);
		ccnt += MOD;
	}
	CHECK(__atomic_load_n(at->word, __ATOMIC_SEQ_CST) == M, "word %llu after %d unsignaled adds",
	      (unsigned long long)*at->word, M);
	CHECK(ibv_dereg_mr(at->tmr) == 0 && ibv_dereg_mr(at->rmr) == 0, "dereg");
	free(at->tbuf);
	free(at->res);
}

/* atomic-refused: toward a peer without RFC 7306 atomics (--rdmap-ext
 * off, which also reports IBV_ATOMIC_NONE) both atomics fail at post time
 * with EOPNOTSUPP, bad_wr naming them, and nothing completes. */
static void case_no_atomic(struct fix *f)
{
	struct ibv_device_attr da;
	CHECK(ibv_query_device(f->pdb->context, &da) == 0 && da.atomic_cap == IBV_ATOMIC_NONE, "B's atomic_cap %d", da.atomic_cap);
	uint64_t *res = calloc(1, 8);
	CHECK(res, "calloc");
	struct ibv_mr *rmr = ibv_reg_mr(f->pda, res, 8, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rmr, "register the result");
	const enum ibv_wr_opcode ops[2] = {IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_CMP_AND_SWP};
	for (int k = 0; k < 2; k++) {
		struct ibv_sge sge = {(uintptr_t)res, 8, rmr->lkey};
		struct ibv_send_wr wr = {.wr_id = 950 + (uint64_t)k, .sg_list = &sge, .num_sge = 1, .opcode = ops[k],
					 .send_flags = IBV_SEND_SIGNALED}, *bad = NULL;
		wr.wr.atomic.remote_addr = 0x1000;
		wr.wr.atomic.rkey = 1;
		wr.wr.atomic.compare_add = 1;
		CHECK(ibv_post_send(f->qpa, &wr, &bad) == EOPNOTSUPP && bad == &wr, "opcode %d toward a peer without atomics", ops[k]);
	}
	struct ibv_wc wc;
	usleep(100000);
	CHECK(ibv_poll_cq(f->cqa, 1, &wc) == 0, "a refused atomic completed");
	CHECK(ibv_dereg_mr(rmr) == 0, "dereg");
	free(res);
}

/* removal: siwtun-ctest --removal DEV: with a PD, an armed CQ on a
 * completion channel and a listening rdma_cm id on DEV, prints "ready" and
 * waits for its daemon to stop: the async event IBV_EVENT_DEVICE_FATAL,
 * the channel's fd readable, RDMA_CM_EVENT_DEVICE_REMOVAL, and ENODEV from
 * later calls. */
static int removal(const char *dev)
{
	struct ibv_context *c = tl_open_dev(dev);
	struct sockaddr_in sin;
	tl_get_addr(c, &sin);
	sin.sin_port = htons(17998);
	struct ibv_pd *pd = ibv_alloc_pd(c);
	struct ibv_comp_channel *cc = ibv_create_comp_channel(c);
	struct ibv_cq *cq = cc ? ibv_create_cq(c, 8, NULL, cc, 0) : NULL;
	CHECK(pd && cq && ibv_req_notify_cq(cq, 0) == 0, "resources");
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	CHECK(ch && rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0, "cm id");
	CHECK(rdma_bind_addr(lid, (struct sockaddr *)&sin) == 0 && rdma_listen(lid, 1) == 0, "listen");
	printf("ready\n");
	struct ibv_async_event ae;
	CHECK(ibv_get_async_event(c, &ae) == 0 && ae.event_type == IBV_EVENT_DEVICE_FATAL, "async event %d", ae.event_type);
	ibv_ack_async_event(&ae);
	OK("async-device-fatal");
	struct pollfd pf = {.fd = cc->fd, .events = POLLIN};
	CHECK(poll(&pf, 1, 5000) == 1, "comp channel not woken by the removal");
	struct ibv_cq *evcq;
	void *evctx;
	CHECK(ibv_get_cq_event(cc, &evcq, &evctx) == 0 && evcq == cq, "cq event");
	ibv_ack_cq_events(cq, 1);
	OK("comp-channel-woken");
	tl_ack_event(ch, RDMA_CM_EVENT_DEVICE_REMOVAL);
	OK("cm-device-removal");
	errno = 0;
	CHECK(!ibv_alloc_pd(c) && errno == ENODEV, "alloc pd after removal");
	CHECK(ibv_reg_mr(pd, &sin, sizeof(sin), 0) == NULL && errno == ENODEV, "reg mr after removal");
	OK("enodev");
	rdma_destroy_id(lid);
	rdma_destroy_event_channel(ch);
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_comp_channel(cc) == 0 && ibv_dealloc_pd(pd) == 0, "teardown");
	CHECK(ibv_close_device(c) == 0, "close");
	printf("PASS\n");
	return 0;
}

/* ---- rsockets (--rsockets DEV_A DEV_B PORT) ---- */

struct rs_rx {
	int fd;
	uint8_t *buf;
	size_t len;
	ssize_t got;
};

static void *rs_receiver(void *arg)
{
	struct rs_rx *r = arg;
	r->got = rrecv(r->fd, r->buf, r->len, MSG_WAITALL);
	return NULL;
}

static uint8_t rs_pattern(size_t i) { return (uint8_t)(i * 7 + i / 251); }

/* rsockets: a listener on DEV_B's address, a client from DEV_A connecting
 * without blocking (one thread holds both ends), then data both ways
 * through every send and receive call, more than the receive slots hold
 * (credits), MSG_PEEK, riomap/riowrite with guard bytes, rpoll and rselect
 * on a mix of rsockets and a pipe, options, shutdown (EOF), close (EBADF
 * after) and the refusals (datagram sockets, other families). */
static int rsockets(const char *deva, const char *devb, int port)
{
	struct ibv_context *ca = tl_open_dev(deva), *cb = tl_open_dev(devb);
	struct sockaddr_in addr_a, addr_b;
	tl_get_addr(ca, &addr_a);
	tl_get_addr(cb, &addr_b);
	addr_b.sin_port = htons((uint16_t)port);

	/* rdma_migrate_id (each accepted rsocket gets a channel of its own):
	 * an event queued on the old channel moves with the id. */
	struct rdma_event_channel *mx = rdma_create_event_channel(), *my = rdma_create_event_channel();
	struct rdma_cm_id *mid;
	CHECK(mx && my && rdma_create_id(mx, &mid, NULL, RDMA_PS_TCP) == 0, "migrate: id");
	CHECK(rdma_resolve_addr(mid, (struct sockaddr *)&addr_a, (struct sockaddr *)&addr_b, 2000) == 0, "migrate: resolve");
	CHECK(rdma_migrate_id(mid, my) == 0 && mid->channel == my, "rdma_migrate_id");
	struct pollfd mp = {.fd = mx->fd, .events = POLLIN};
	CHECK(poll(&mp, 1, 0) == 0, "the old channel still readable after the move");
	tl_ack_event(my, RDMA_CM_EVENT_ADDR_RESOLVED);
	/* To no channel: synchronous on a channel of its own (librdmacm);
	 * a synchronous id cannot go to none again; back to a channel. */
	CHECK(rdma_migrate_id(mid, NULL) == 0 && mid->channel && mid->channel != my && mid->channel != mx,
	      "migrate to no channel");
	errno = 0;
	CHECK(rdma_migrate_id(mid, NULL) == -1 && errno == EINVAL, "migrate a synchronous id to no channel");
	CHECK(rdma_migrate_id(mid, mx) == 0 && mid->channel == mx, "migrate a synchronous id to a channel");
	CHECK(rdma_destroy_id(mid) == 0, "migrate: destroy");
	rdma_destroy_event_channel(mx);
	rdma_destroy_event_channel(my);
	OK("rdma-migrate-id");

	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_DGRAM, 0) == -1 && errno == EOPNOTSUPP, "datagram rsocket");
	CHECK(rsocket(AF_UNIX, SOCK_STREAM, 0) == -1 && errno == EAFNOSUPPORT, "AF_UNIX rsocket");
	CHECK(rsend(12345, "x", 1, 0) == -1 && errno == EBADF, "rsend on no rsocket");
	OK("rsocket-refusals");

	int l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0, "rsocket");
	int one = 1, v;
	socklen_t vl = sizeof(v);
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0, "SO_REUSEADDR");
	CHECK(rsetsockopt(l, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0, "TCP_NODELAY");
	int sz = 1 << 19;
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz)) == 0, "SO_RCVBUF");
	CHECK(rgetsockopt(l, SOL_SOCKET, SO_RCVBUF, &v, &vl) == 0 && v == sz, "SO_RCVBUF back: %d", v);
	CHECK(rgetsockopt(l, IPPROTO_TCP, TCP_NODELAY, &v, &vl) == 0 && v == 1, "TCP_NODELAY back");
	int inl = 32;
	CHECK(rsetsockopt(l, SOL_RDMA, RDMA_INLINE, &inl, sizeof(inl)) == 0, "RDMA_INLINE");
	CHECK(rgetsockopt(l, SOL_RDMA, RDMA_INLINE, &v, &vl) == 0 && v == 32, "RDMA_INLINE back");
	errno = 0;
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_BROADCAST, &one, sizeof(one)) == -1 && errno == ENOTSUP, "SO_BROADCAST");
	OK("rsocket-options");

	CHECK(rbind(l, (struct sockaddr *)&addr_b, sizeof(addr_b)) == 0, "rbind");
	CHECK(rlisten(l, 4) == 0, "rlisten");
	CHECK(rfcntl(l, F_SETFL, O_NONBLOCK) == 0 && (rfcntl(l, F_GETFL) & O_NONBLOCK), "rfcntl");
	errno = 0;
	CHECK(raccept(l, NULL, NULL) == -1 && errno == EAGAIN, "raccept with nothing there");
	struct pollfd lp = {.fd = l, .events = POLLIN};
	CHECK(rpoll(&lp, 1, 0) == 0, "listener ready with nothing there");
	CHECK(rfcntl(l, F_SETFL, 0) == 0, "rfcntl blocking");

	int c = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(c >= 0, "client rsocket");
	struct sockaddr_in from = addr_a;
	from.sin_port = 0;
	CHECK(rbind(c, (struct sockaddr *)&from, sizeof(from)) == 0, "client rbind");
	errno = 0;
	CHECK(rconnect(c, (struct sockaddr *)&addr_b, sizeof(addr_b)) == -1 && errno == EINPROGRESS, "rconnect");
	CHECK(rpoll(&lp, 1, 10000) == 1 && (lp.revents & POLLIN), "listener not readable on a request");
	struct sockaddr_in peer;
	socklen_t pl = sizeof(peer);
	int s = raccept(l, (struct sockaddr *)&peer, &pl);
	CHECK(s >= 0, "raccept");
	CHECK(pl == sizeof(peer) && peer.sin_addr.s_addr == addr_a.sin_addr.s_addr, "accepted from %s", inet_ntoa(peer.sin_addr));
	struct pollfd cp = {.fd = c, .events = POLLOUT};
	CHECK(rpoll(&cp, 1, 10000) == 1 && (cp.revents & POLLOUT), "client not writable once connected");
	CHECK(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &v, &vl) == 0 && v == 0, "SO_ERROR %d", v);
	struct sockaddr_in name;
	socklen_t nl = sizeof(name);
	CHECK(rgetpeername(c, (struct sockaddr *)&name, &nl) == 0 && name.sin_addr.s_addr == addr_b.sin_addr.s_addr &&
		      name.sin_port == addr_b.sin_port, "rgetpeername");
	nl = sizeof(name);
	CHECK(rgetsockname(s, (struct sockaddr *)&name, &nl) == 0 && name.sin_addr.s_addr == addr_b.sin_addr.s_addr,
	      "rgetsockname");
	OK("rsocket-connect");

	/* More than the receive slots hold, one direction, a thread receiving. */
	size_t big = (3u << 20) + 17;
	uint8_t *tx = malloc(big), *rx = calloc(1, big);
	CHECK(tx && rx, "malloc");
	for (size_t i = 0; i < big; i++)
		tx[i] = rs_pattern(i);
	CHECK(rfcntl(c, F_SETFL, 0) == 0, "client blocking");
	struct rs_rx r = {.fd = s, .buf = rx, .len = big};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, rs_receiver, &r) == 0, "thread");
	CHECK(rsend(c, tx, big, 0) == (ssize_t)big, "rsend %zu", big);
	pthread_join(th, NULL);
	CHECK(r.got == (ssize_t)big && !memcmp(tx, rx, big), "received %zd of %zu bytes, or not the same", r.got, big);
	OK("rsocket-stream");

	/* The other way, gathered and scattered, peeked; rwrite/rread. */
	struct iovec iv[3] = {{tx, 10}, {tx + 10, 70000}, {tx + 70010, 5}};
	struct msghdr m = {.msg_iov = iv, .msg_iovlen = 3};
	CHECK(rsendmsg(s, &m, 0) == 70015, "rsendmsg");
	CHECK(rwrite(s, tx + 70015, 100) == 100, "rwrite");
	uint8_t p4[4];
	CHECK(rrecv(c, p4, 4, MSG_PEEK) == 4 && !memcmp(p4, tx, 4), "MSG_PEEK");
	memset(rx, 0, big);
	struct iovec ov[2] = {{rx, 3}, {rx + 3, 70012}};
	struct msghdr om = {.msg_iov = ov, .msg_iovlen = 2};
	size_t got = 0;
	while (got < 70015) {
		ov[0].iov_base = rx + got;
		ov[0].iov_len = got < 3 ? 3 - got : 0;
		ov[1].iov_base = rx + (got < 3 ? 3 : got);
		ov[1].iov_len = 70015 - (got < 3 ? 3 : got);
		ssize_t n = rrecvmsg(c, &om, 0);
		CHECK(n > 0, "rrecvmsg");
		got += (size_t)n;
	}
	for (got = 70015; got < 70115;) {
		ssize_t n = rread(c, rx + got, 70115 - got);
		CHECK(n > 0, "rread");
		got += (size_t)n;
	}
	CHECK(!memcmp(tx, rx, 70115), "data back differs");
	OK("rsocket-iovecs");

	/* rpoll and rselect on a pipe and an rsocket together. */
	int pfd[2];
	CHECK(pipe(pfd) == 0, "pipe");
	struct pollfd mix[2] = {{.fd = pfd[0], .events = POLLIN}, {.fd = s, .events = POLLIN}};
	CHECK(rpoll(mix, 2, 0) == 0, "nothing ready");
	CHECK(write(pfd[1], "p", 1) == 1, "pipe write");
	CHECK(rpoll(mix, 2, 1000) == 1 && mix[0].revents == POLLIN && mix[1].revents == 0, "pipe ready only");
	char ch;
	CHECK(read(pfd[0], &ch, 1) == 1, "pipe read");
	CHECK(rsend(c, "q", 1, 0) == 1, "rsend 1");
	CHECK(rpoll(mix, 2, 5000) == 1 && mix[0].revents == 0 && (mix[1].revents & POLLIN), "rsocket ready only");
	fd_set rf;
	FD_ZERO(&rf);
	FD_SET(s, &rf);
	FD_SET(pfd[0], &rf);
	struct timeval tv = {.tv_sec = 5};
	CHECK(rselect((s > pfd[0] ? s : pfd[0]) + 1, &rf, NULL, NULL, &tv) == 1 && FD_ISSET(s, &rf) && !FD_ISSET(pfd[0], &rf),
	      "rselect");
	CHECK(rrecv(s, &ch, 1, 0) == 1 && ch == 'q', "rrecv 1");
	close(pfd[0]);
	close(pfd[1]);
	OK("rsocket-rpoll-rselect");

	/* riomap on the accepted side, riowrite from the client, a Send after
	 * it (its arrival means the Write is placed), guard bytes checked. */
	size_t ml = 100000;
	uint8_t *map = malloc(GUARD + ml + GUARD);
	CHECK(map, "malloc");
	memset(map, GUARD_BYTE, GUARD + ml + GUARD);
	CHECK(riomap(s, map + GUARD, ml, PROT_WRITE, 0, 0) == 0, "riomap");
	CHECK(rsend(s, "m", 1, 0) == 1 && rrecv(c, &ch, 1, 0) == 1 && ch == 'm', "sync after riomap");
	CHECK(riowrite(c, tx, ml, 0, 0) == ml, "riowrite");
	CHECK(rsend(c, "w", 1, 0) == 1 && rrecv(s, &ch, 1, 0) == 1 && ch == 'w', "sync after riowrite");
	CHECK(!memcmp(map + GUARD, tx, ml), "riowrite data differs");
	for (int i = 0; i < GUARD; i++)
		CHECK(map[i] == GUARD_BYTE && map[GUARD + ml + (size_t)i] == GUARD_BYTE, "guard byte %d written", i);
	CHECK(riounmap(s, map + GUARD, ml) == 0, "riounmap");
	errno = 0;
	CHECK(riounmap(s, map + GUARD, ml) == -1 && errno == EINVAL, "riounmap twice");
	OK("rsocket-iomap");

	/* Shutdown: the peer reads what was sent, then EOF. */
	CHECK(rsend(c, "end", 3, 0) == 3, "rsend end");
	CHECK(rshutdown(c, SHUT_WR) == 0, "rshutdown");
	char e[8];
	CHECK(rrecv(s, e, sizeof(e), MSG_WAITALL) == 3 && !memcmp(e, "end", 3), "data before EOF");
	CHECK(rrecv(s, e, sizeof(e), 0) == 0, "EOF after shutdown");
	errno = 0;
	CHECK(rsend(c, "x", 1, 0) == -1 && errno == EPIPE, "rsend after shutdown");
	OK("rsocket-shutdown");

	/* Close: the peer sees the disconnect; the number is gone. */
	CHECK(rclose(c) == 0, "rclose client");
	struct pollfd sp = {.fd = s, .events = POLLIN};
	CHECK(rpoll(&sp, 1, 10000) == 1 && (sp.revents & (POLLIN | POLLHUP)), "no hangup after the peer closed");
	CHECK(rrecv(s, e, sizeof(e), 0) == 0, "EOF after close");
	errno = 0;
	CHECK(rrecv(c, e, 1, 0) == -1 && errno == EBADF, "rrecv on a closed rsocket");
	CHECK(rclose(s) == 0 && rclose(l) == 0, "rclose");
	OK("rsocket-close");
	free(map);
	free(tx);
	free(rx);
	CHECK(ibv_close_device(ca) == 0 && ibv_close_device(cb) == 0, "close");
	printf("PASS\n");
	return 0;
}


/* ---- the cases of a run on two devices, in the order cases[] runs them ---- */

/* devices: both devices open (listed once, iWARP RNICs), their addresses. */
static void case_devices(struct fix *f)
{
	f->ca = tl_open_dev(f->dev_a);
	f->cb = tl_open_dev(f->dev_b);
	tl_get_addr(f->ca, &f->addr_a);
	tl_get_addr(f->cb, &f->addr_b);
	f->addr_b.sin_port = htons((uint16_t)f->port);
}

/* bind-port-0: a port at bind (to port 0) and the device's PD; binding a
 * bound id refused; listen with backlog 0 on the port. The listener stays
 * for disconnect-destroy-qp. */
static void case_bind_port0(struct fix *f)
{
	f->scha = rdma_create_event_channel();
	f->schb = rdma_create_event_channel();
	CHECK(f->scha && f->schb, "semantics: channels");
	struct sockaddr_in any_b = f->addr_b;
	any_b.sin_port = 0;
	CHECK(rdma_create_id(f->schb, &f->slid, NULL, RDMA_PS_TCP) == 0 && rdma_bind_addr(f->slid, (struct sockaddr *)&any_b) == 0,
	      "bind to port 0");
	struct rdma_cm_id *lid = f->slid;
	uint16_t got = ntohs(rdma_get_src_port(lid));
	CHECK(got != 0 && lid->verbs && lid->pd, "a port (%u) and the device's PD at bind", got);
	errno = 0;
	CHECK(rdma_bind_addr(lid, (struct sockaddr *)&any_b) == -1 && errno == EINVAL, "binding a bound id");
	CHECK(rdma_listen(lid, 0) == 0 && ntohs(rdma_get_src_port(lid)) == got, "listen with backlog 0 on the bound port");
	f->sport = got;
}

/* loopback-bind-options: a loopback bind takes a port and no device (as
 * rdma_cm, which counts loopback as any address); id options (ack timeout,
 * TOS, reuse) and their refusals; a synchronous id migrated to a channel;
 * resolving binds it to a device. */
static void case_loopback_options(struct fix *f)
{
	struct rdma_cm_id *lo;
	struct sockaddr_in loop = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	CHECK(rdma_create_id(NULL, &lo, NULL, RDMA_PS_TCP) == 0 && rdma_bind_addr(lo, (struct sockaddr *)&loop) == 0 &&
	      !lo->verbs && !lo->pd && rdma_get_src_port(lo) != 0 &&
	      ((struct sockaddr_in *)rdma_get_local_addr(lo))->sin_addr.s_addr == htonl(INADDR_LOOPBACK),
	      "loopback binds a port and no device");
	uint8_t t21 = 21, tos = 0;
	int one = 1;
	CHECK(rdma_set_option(lo, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t21, 1) == 0 &&
	      rdma_set_option(lo, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0 &&
	      rdma_set_option(lo, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)) == 0, "options");
	errno = 0;
	CHECK(rdma_set_option(lo, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &one, sizeof(one)) == -1 && errno == EINVAL,
	      "ack timeout of the wrong size");
	errno = 0;
	CHECK(rdma_set_option(lo, RDMA_OPTION_ID, 99, &one, sizeof(one)) == -1 && errno == ENOSYS, "unknown option");
	/* To no channel and back: a synchronous id moved to a channel. */
	struct rdma_event_channel *mch = rdma_create_event_channel();
	CHECK(mch && rdma_migrate_id(lo, mch) == 0 && lo->channel == mch, "migrate a synchronous id to a channel");
	CHECK(rdma_resolve_addr(lo, NULL, (struct sockaddr *)&f->addr_b, 2000) == 0, "resolve from loopback");
	tl_ack_event(mch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(lo->verbs && lo->pd, "resolving binds the loopback id to a device");
	CHECK(rdma_destroy_id(lo) == 0, "destroy the loopback id");
	rdma_destroy_event_channel(mch);
}

/* addrinfo-hints: rdma_getaddrinfo from a hint's destination alone; of
 * nothing, EINVAL; XRC endpoints, either end, EOPNOTSUPP at once. */
static void case_addrinfo_hints(struct fix *f)
{
	struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP}, *res;
	hints.ai_dst_addr = (struct sockaddr *)&f->addr_b;
	hints.ai_dst_len = sizeof(f->addr_b);
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 && res->ai_dst_len == sizeof(f->addr_b) &&
	      !memcmp(res->ai_dst_addr, &f->addr_b, sizeof(f->addr_b)) && res->ai_qp_type == IBV_QPT_RC, "hint-only addrinfo");
	struct rdma_addrinfo xrc = *res;
	struct rdma_cm_id *xid = NULL;
	struct ibv_qp_init_attr xa = {.cap = {.max_recv_wr = 1, .max_recv_sge = 1}};
	xrc.ai_qp_type = IBV_QPT_XRC_SEND;
	errno = 0;
	CHECK(rdma_create_ep(&xid, &xrc, NULL, &xa) == -1 && errno == EOPNOTSUPP && !xid, "an XRC endpoint");
	xrc.ai_qp_type = IBV_QPT_XRC_RECV;
	xrc.ai_flags |= RAI_PASSIVE;
	xrc.ai_src_addr = (struct sockaddr *)&f->addr_b;
	xrc.ai_src_len = sizeof(f->addr_b);
	errno = 0;
	CHECK(rdma_create_ep(&xid, &xrc, NULL, &xa) == -1 && errno == EOPNOTSUPP && !xid, "a passive XRC endpoint");
	rdma_freeaddrinfo(res);
	struct rdma_addrinfo none = {0};
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, &none, &res) == -1 && errno == EINVAL, "addrinfo of nothing");
}

/* disconnect-destroy-qp: a connection to bind-port-0's listener (QPs in
 * the ids' PDs), then rdma_disconnect and the QP destroyed at once (as
 * cmtime does): DISCONNECTED on both sides. */
static void case_disconnect_destroy_qp(struct fix *f)
{
	struct rdma_event_channel *cha = f->scha, *chb = f->schb;
	struct rdma_cm_id *aid;
	struct sockaddr_in dst = f->addr_b;
	dst.sin_port = htons(f->sport);
	CHECK(rdma_create_id(cha, &aid, NULL, RDMA_PS_TCP) == 0 &&
	      rdma_resolve_addr(aid, (struct sockaddr *)&f->addr_a, (struct sockaddr *)&dst, 2000) == 0, "resolve");
	tl_ack_event(cha, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(aid->pd && rdma_resolve_route(aid, 2000) == 0, "the device's PD at resolve");
	tl_ack_event(cha, RDMA_CM_EVENT_ROUTE_RESOLVED);
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC, .cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(rdma_create_qp(aid, NULL, &qa) == 0 && aid->qp->pd == aid->pd, "rdma_create_qp in the id's PD");
	CHECK(rdma_connect(aid, NULL) == 0, "connect");
	struct rdma_cm_id *sid = tl_request(chb);
	struct ibv_qp_init_attr qb = qa;
	CHECK(sid->pd && rdma_create_qp(sid, NULL, &qb) == 0 && rdma_accept(sid, NULL) == 0, "accept");
	tl_established(chb, cha);
	CHECK(rdma_disconnect(aid) == 0, "disconnect");
	rdma_destroy_qp(aid);
	tl_disconnected(cha, chb);
	rdma_destroy_qp(sid);
	CHECK(rdma_destroy_id(sid) == 0 && rdma_destroy_id(aid) == 0 && rdma_destroy_id(f->slid) == 0, "destroy");
	rdma_destroy_event_channel(cha);
	rdma_destroy_event_channel(chb);
}

/* wildcard-listener: an id bound to 0.0.0.0 is on no device, as with
 * rdma_cm (libfabric's verbs provider relies on it): no verbs, no PD, no
 * QP; it listens, and its connection requests come on an id of the
 * device, whose local address is the device's and the listener's port. */
static void case_wildcard_listener(struct fix *f)
{
	struct rdma_event_channel *cha = rdma_create_event_channel(), *chb = rdma_create_event_channel();
	CHECK(cha && chb, "wildcard: channels");
	struct rdma_cm_id *wid, *aid;
	struct sockaddr_in wild = {.sin_family = AF_INET};
	CHECK(rdma_create_id(chb, &wid, NULL, RDMA_PS_TCP) == 0 && rdma_bind_addr(wid, (struct sockaddr *)&wild) == 0,
	      "bind to 0.0.0.0");
	uint16_t port = ntohs(rdma_get_src_port(wid));
	CHECK(port != 0 && !wid->verbs && !wid->pd, "a port (%u) and no device at a wildcard bind", port);
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC, .cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp_init_attr q0 = qa;
	errno = 0;
	CHECK(rdma_create_qp(wid, NULL, &q0) == -1 && errno == EINVAL, "no QP on an id of no device");
	CHECK(rdma_listen(wid, 0) == 0 && ntohs(rdma_get_src_port(wid)) == port, "listen on 0.0.0.0");

	/* The listener is on the device a loopback destination resolves to:
	 * the first (there is no other way to name a device of no address). */
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = htons(port)};
	CHECK(rdma_create_id(cha, &aid, NULL, RDMA_PS_TCP) == 0 &&
	      rdma_resolve_addr(aid, NULL, (struct sockaddr *)&dst, 2000) == 0, "resolve loopback");
	tl_ack_event(cha, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(aid->verbs && aid->pd && rdma_resolve_route(aid, 2000) == 0, "a device at resolve");
	tl_ack_event(cha, RDMA_CM_EVENT_ROUTE_RESOLVED);
	struct ibv_qp_init_attr qc = qa;
	CHECK(rdma_create_qp(aid, NULL, &qc) == 0 && rdma_connect(aid, NULL) == 0, "connect to the wildcard listener");
	struct rdma_cm_id *cid = tl_request(chb);
	struct sockaddr_in *local = (struct sockaddr_in *)rdma_get_local_addr(cid);
	CHECK(cid->verbs == aid->verbs && cid->pd == aid->pd, "the request's id is on the listener's device");
	CHECK(local->sin_family == AF_INET && ntohs(local->sin_port) == port &&
	      (local->sin_addr.s_addr == f->addr_a.sin_addr.s_addr || local->sin_addr.s_addr == f->addr_b.sin_addr.s_addr),
	      "the request's local address is the device's, the port the listener's");
	struct ibv_qp_init_attr qb = qa;
	CHECK(rdma_create_qp(cid, NULL, &qb) == 0 && rdma_accept(cid, NULL) == 0, "accept");
	tl_established(chb, cha);
	CHECK(rdma_disconnect(aid) == 0, "disconnect");
	tl_disconnected(cha, chb);
	rdma_destroy_qp(aid);
	rdma_destroy_qp(cid);
	CHECK(rdma_destroy_id(cid) == 0 && rdma_destroy_id(aid) == 0 && rdma_destroy_id(wid) == 0, "destroy");
	rdma_destroy_event_channel(cha);
	rdma_destroy_event_channel(chb);
}

/* resolve: B listens on its address (on DEV_B), A's id resolves from its
 * address (on DEV_A); A's PD, completion channel and CQ. */
static void case_resolve(struct fix *f)
{
	f->cha = rdma_create_event_channel();
	f->chb = rdma_create_event_channel();
	CHECK(f->cha && f->chb, "event channels");
	f->lid = tl_listen(f->chb, &f->addr_b, 4);
	CHECK(!strcmp(ibv_get_device_name(f->lid->verbs->device), f->dev_b), "listener on %s", f->dev_b);
	CHECK(rdma_create_id(f->cha, &f->aid, NULL, RDMA_PS_TCP) == 0, "create id");
	CHECK(rdma_resolve_addr(f->aid, (struct sockaddr *)&f->addr_a, (struct sockaddr *)&f->addr_b, 2000) == 0, "resolve addr");
	tl_ack_event(f->cha, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(!strcmp(ibv_get_device_name(f->aid->verbs->device), f->dev_a), "client on %s", f->dev_a);
	CHECK(rdma_resolve_route(f->aid, 2000) == 0, "resolve route");
	tl_ack_event(f->cha, RDMA_CM_EVENT_ROUTE_RESOLVED);
	f->pda = ibv_alloc_pd(f->aid->verbs);
	CHECK(f->pda, "alloc pd A");
	f->cca = ibv_create_comp_channel(f->aid->verbs);
	CHECK(f->cca, "comp channel A");
	f->cqa = ibv_create_cq(f->aid->verbs, 64, NULL, f->cca, 0);
	CHECK(f->cqa, "cq A");
}

/* connect: A's QP (its inline capacity), private data both ways, IRD/ORD
 * seen by the listener, B's objects on the listener's device, RTS and the
 * init attributes by ibv_query_qp. */
static void case_connect(struct fix *f)
{
	struct ibv_qp_init_attr *qa = &f->qa;
	*qa = (struct ibv_qp_init_attr){.send_cq = f->cqa, .recv_cq = f->cqa, .qp_type = IBV_QPT_RC,
					.cap = {.max_send_wr = 32, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64}};
	CHECK(rdma_create_qp(f->aid, f->pda, qa) == 0, "rdma_create_qp A");
	CHECK(qa->cap.max_inline_data >= 64, "inline cap");
	static const char hello[] = "siwtun-ctest hello";
	struct rdma_conn_param cp = {.private_data = hello, .private_data_len = sizeof(hello), .responder_resources = 4,
				     .initiator_depth = 4};
	CHECK(rdma_connect(f->aid, &cp) == 0, "connect");
	struct rdma_cm_event *ev = tl_wait_event(f->chb, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(ev->listen_id == f->lid && ev->param.conn.private_data_len >= sizeof(hello) &&
	      !memcmp(ev->param.conn.private_data, hello, sizeof(hello)), "connect request private data");
	CHECK(ev->param.conn.initiator_depth == 4 && ev->param.conn.responder_resources == 4, "IRD/ORD %u/%u",
	      ev->param.conn.initiator_depth, ev->param.conn.responder_resources);
	f->bid = ev->id;
	rdma_ack_cm_event(ev);
	struct rdma_cm_id *bid = f->bid;
	CHECK(bid->verbs == f->lid->verbs, "child on the listener's device");
	f->pdb = ibv_alloc_pd(bid->verbs);
	f->ccb = ibv_create_comp_channel(bid->verbs);
	f->cqb = f->ccb ? ibv_create_cq(bid->verbs, 64, f->cb, f->ccb, 0) : NULL;
	CHECK(f->pdb && f->ccb && f->cqb, "B resources");
	struct ibv_qp_init_attr qb = *qa;
	qb.send_cq = qb.recv_cq = f->cqb;
	CHECK(rdma_create_qp(bid, f->pdb, &qb) == 0, "rdma_create_qp B");
	f->qpa = f->aid->qp;
	f->qpb = bid->qp;
	CHECK(rdma_accept(bid, NULL) == 0, "accept");
	tl_established(f->cha, f->chb);
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK(ibv_query_qp(f->qpa, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_RTS, "query qp: state %d",
	      attr.qp_state);
	CHECK(init.send_cq == f->cqa && init.qp_type == IBV_QPT_RC, "query qp init attr");
}

/* ports: the listener's and the accepted id's source port is the
 * listening port, which is the connecting id's destination; the connecting
 * id's source port is its TCP connection's, which the accepted id sees as
 * its peer's; the connecting side's address on both ids. */
static void case_ports(struct fix *f)
{
	struct rdma_cm_id *lid = f->lid, *aid = f->aid, *bid = f->bid;
	uint16_t port = (uint16_t)f->port;
	CHECK(rdma_get_src_port(lid) == htons(port) && rdma_get_dst_port(lid) == 0, "listener ports %u %u",
	      ntohs(rdma_get_src_port(lid)), ntohs(rdma_get_dst_port(lid)));
	CHECK(rdma_get_dst_port(aid) == htons(port) && rdma_get_src_port(bid) == htons(port),
	      "listening port: connecting id's destination %u, accepted id's source %u", ntohs(rdma_get_dst_port(aid)),
	      ntohs(rdma_get_src_port(bid)));
	CHECK(rdma_get_src_port(aid) != 0 && rdma_get_src_port(aid) == rdma_get_dst_port(bid),
	      "connection's port: connecting id's source %u, accepted id's destination %u", ntohs(rdma_get_src_port(aid)),
	      ntohs(rdma_get_dst_port(bid)));
	struct sockaddr_in *la = (struct sockaddr_in *)rdma_get_local_addr(aid), *pa = (struct sockaddr_in *)rdma_get_peer_addr(bid);
	CHECK(la->sin_family == AF_INET && pa->sin_family == AF_INET && la->sin_addr.s_addr == f->addr_a.sin_addr.s_addr &&
	      pa->sin_addr.s_addr == f->addr_a.sin_addr.s_addr, "connecting side's address");
}

/* notify: iWARP's connection manager has nothing to learn from QP events
 * (rdma_cm's answer for every non-IB device), but an id with no connection
 * has nothing to notify (EINVAL, as rdma_cm). */
static void case_notify(struct fix *f)
{
	CHECK(rdma_notify(f->aid, IBV_EVENT_COMM_EST) == 0 && rdma_notify(f->bid, IBV_EVENT_COMM_EST) == 0, "notify");
	struct rdma_cm_id *nid;
	CHECK(rdma_create_id(f->cha, &nid, NULL, RDMA_PS_TCP) == 0, "create id");
	errno = 0;
	CHECK(rdma_notify(nid, IBV_EVENT_COMM_EST) == -1 && errno == EINVAL, "notify on an id without connection");
	CHECK(rdma_destroy_id(nid) == 0, "destroy id");
}

/* ud: rdma_cm makes datagram ids before a device is chosen, and an iWARP
 * RNIC has no UD service (RDMAP over DDP over MPA over TCP; Linux's siw
 * creates RC QPs only): what needs it fails with EOPNOTSUPP. An unknown
 * port space is EINVAL, as rdma_cm's. */
static void case_ud(struct fix *f)
{
	const enum rdma_port_space ud[2] = {RDMA_PS_UDP, RDMA_PS_IPOIB};
	for (int k = 0; k < 2; k++) {
		struct rdma_cm_id *uid;
		CHECK(rdma_create_id(f->cha, &uid, NULL, ud[k]) == 0, "create id in port space %#x", ud[k]);
		CHECK(uid->ps == ud[k] && uid->qp_type == IBV_QPT_UD, "UD id: ps %#x qp type %d", uid->ps, uid->qp_type);
		struct sockaddr_in ua = f->addr_a;
		ua.sin_port = htons((uint16_t)(f->port + 1));
		CHECK(rdma_bind_addr(uid, (struct sockaddr *)&ua) == 0, "bind UD id");
		errno = 0;
		CHECK(rdma_listen(uid, 1) == -1 && errno == EOPNOTSUPP, "listen on a UD id");
		struct ibv_qp_init_attr uq = f->qa;
		uq.qp_type = IBV_QPT_UD;
		errno = 0;
		CHECK(rdma_create_qp(uid, f->pda, &uq) == -1 && errno == EOPNOTSUPP && !uid->qp, "UD QP on a UD id");
		uq.qp_type = IBV_QPT_RC;
		errno = 0;
		CHECK(rdma_create_qp(uid, f->pda, &uq) == -1 && errno == EOPNOTSUPP && !uid->qp, "RC QP on a UD id");
		errno = 0;
		CHECK(rdma_connect(uid, NULL) == -1 && errno == EOPNOTSUPP, "connect a UD id");
		CHECK(rdma_destroy_id(uid) == 0, "destroy UD id");
	}
	struct rdma_addrinfo hints = {.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST, .ai_port_space = RDMA_PS_UDP}, *res;
	CHECK(rdma_getaddrinfo("198.18.0.1", "7174", &hints, &res) == 0 && res->ai_qp_type == IBV_QPT_UD &&
	      res->ai_port_space == RDMA_PS_UDP, "rdma_getaddrinfo for UDP");
	rdma_freeaddrinfo(res);
	struct rdma_cm_id *bad;
	errno = 0;
	CHECK(rdma_create_id(f->cha, &bad, NULL, (enum rdma_port_space)0x0999) == -1 && errno == EINVAL, "unknown port space");
}

/* qp-extras: what a QP does not offer: ECE (an IB CM extension), the
 * extended QP; and no promise that data is placed in order (DDP places
 * tagged segments as they come). */
static void case_qp_extras(struct fix *f)
{
	struct ibv_ece ece = {.vendor_id = 0x15b3, .options = 1};
	CHECK(ibv_query_ece(f->qpa, &ece) == EOPNOTSUPP && ibv_set_ece(f->qpa, &ece) == EOPNOTSUPP, "QP ECE");
	errno = 0;
	CHECK(rdma_set_local_ece(f->aid, &ece) == -1 && errno == EOPNOTSUPP, "rdma_set_local_ece");
	errno = 0;
	CHECK(rdma_get_remote_ece(f->aid, &ece) == -1 && errno == EOPNOTSUPP, "rdma_get_remote_ece");
	errno = 0;
	CHECK(!ibv_qp_to_qp_ex(f->qpa) && errno == EOPNOTSUPP, "qp to qp_ex");
	CHECK(ibv_query_qp_data_in_order(f->qpa, IBV_WR_RDMA_WRITE, 0) == 0 && ibv_query_qp_data_in_order(f->qpa, IBV_WR_SEND, 0) == 0 &&
	      ibv_query_qp_data_in_order(f->qpb, IBV_WR_RDMA_READ, 0) == 0, "data in order");
}

/* rdma-devices: rdma_get_devices lists both devices, as the contexts
 * rdma_cm's ids use. */
static void case_rdma_devices(struct fix *f)
{
	int nd = -1;
	struct ibv_context **dl = rdma_get_devices(&nd);
	CHECK(dl && nd == 2 && dl[2] == NULL, "rdma_get_devices: %d", nd);
	int seen_a = 0, seen_b = 0;
	for (int i = 0; i < nd; i++) {
		CHECK(dl[i]->device->transport_type == IBV_TRANSPORT_IWARP, "rdma device transport");
		seen_a += dl[i] == f->aid->verbs && !strcmp(ibv_get_device_name(dl[i]->device), f->dev_a);
		seen_b += dl[i] == f->bid->verbs && !strcmp(ibv_get_device_name(dl[i]->device), f->dev_b);
	}
	CHECK(seen_a == 1 && seen_b == 1, "rdma_get_devices lists %s %d times and %s %d times", f->dev_a, seen_a, f->dev_b,
	      seen_b);
	rdma_free_devices(dl);
}

/* reject: a second connection, refused with private data, which reaches
 * the connecting side's REJECTED; a second reject of it refused; nothing
 * on the refusing side. */
static void case_reject(struct fix *f)
{
	struct rdma_event_channel *cha = f->cha, *chb = f->chb;
	struct rdma_cm_id *rid;
	CHECK(rdma_create_id(cha, &rid, NULL, RDMA_PS_TCP) == 0, "create id");
	tl_resolve(rid, &f->addr_a, &f->addr_b);
	struct ibv_qp_init_attr rq = f->qa;
	CHECK(rdma_create_qp(rid, f->pda, &rq) == 0, "rdma_create_qp");
	static const char ask[] = "may I?";
	struct rdma_conn_param rp = {.private_data = ask, .private_data_len = sizeof(ask)};
	CHECK(rdma_connect(rid, &rp) == 0, "connect");
	struct rdma_cm_event *ev = tl_wait_event(chb, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(ev->listen_id == f->lid && ev->param.conn.private_data_len >= sizeof(ask) &&
	      !memcmp(ev->param.conn.private_data, ask, sizeof(ask)), "request's private data");
	struct rdma_cm_id *refused = ev->id;
	rdma_ack_cm_event(ev);
	static const char no[] = "siwtun-ctest says no";
	CHECK(rdma_reject(refused, no, sizeof(no)) == 0, "reject");
	errno = 0;
	CHECK(rdma_reject(refused, NULL, 0) == -1 && errno == EINVAL, "second reject of one request");
	ev = tl_wait_event(cha, RDMA_CM_EVENT_REJECTED);
	CHECK(ev->id == rid && ev->status == -ECONNREFUSED, "REJECTED status %d", ev->status);
	CHECK(ev->param.conn.private_data_len >= sizeof(no) && !memcmp(ev->param.conn.private_data, no, sizeof(no)),
	      "REJECTED carries %u bytes of private data, not the rejection's", ev->param.conn.private_data_len);
	rdma_ack_cm_event(ev);
	struct pollfd bp = {.fd = chb->fd, .events = POLLIN};
	CHECK(poll(&bp, 1, 200) == 0, "the refusing side got an event");
	rdma_destroy_qp(rid);
	CHECK(rdma_destroy_id(rid) == 0 && rdma_destroy_id(refused) == 0, "destroy ids");
}

/* memory-registration: cases on B (malloc'd, static, stack, unaligned, two
 * regions on one page) registered with their fields and guard bytes
 * checked, the same buffer twice (two keys, both valid); each written by
 * A's RDMA WRITE and read back by A's RDMA READ, the data in the
 * application's memory and the guards untouched. */
static void case_memory(struct fix *f)
{
	f->heap = malloc(GUARD + 5000 + GUARD);
	f->shared = malloc(GUARD + 64 + GUARD + 64 + GUARD); /* two regions on one page */
	f->odd = malloc(GUARD + 777 + GUARD + 1);
	CHECK(f->heap && f->shared && f->odd, "malloc");
	const struct mcase cases[6] = {
		{"malloc", f->heap + GUARD, 5000, NULL},
		{"static", static_buf + GUARD, 1000, NULL},
		{"stack", f->stack + GUARD, 300, NULL},
		{"unaligned", f->odd + GUARD + 1, 777, NULL},
		{"shared-page-1", f->shared + GUARD, 64, NULL},
		{"shared-page-2", f->shared + GUARD + 64 + GUARD, 64, NULL},
	};
	memcpy(f->mem, cases, sizeof(cases));
	const int nc = 6;
	memset(f->shared, GUARD_BYTE, GUARD + 64 + GUARD + 64 + GUARD);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	for (int i = 0; i < nc; i++) {
		struct mcase *m = &f->mem[i];
		fill_guards(m);
		memset(m->p, 0, m->len);
		m->mr = ibv_reg_mr(f->pdb, m->p, m->len, access);
		CHECK(m->mr, "reg_mr %s", m->name);
		CHECK(m->mr->addr == m->p && m->mr->length == m->len, "mr fields");
		check_guards(m);
	}
	f->twice = ibv_reg_mr(f->pdb, f->mem[0].p, f->mem[0].len, access);
	CHECK(f->twice && f->twice->rkey != f->mem[0].mr->rkey, "reg_mr twice");

	f->src = malloc(8192);
	f->back = malloc(8192);
	CHECK(f->src && f->back, "malloc");
	uint8_t *src = f->src, *back = f->back;
	f->srcmr = ibv_reg_mr(f->pda, src, 8192, IBV_ACCESS_LOCAL_WRITE);
	f->backmr = ibv_reg_mr(f->pda, back, 8192, IBV_ACCESS_LOCAL_WRITE);
	CHECK(f->srcmr && f->backmr, "reg src/back");
	for (int i = 0; i < nc + 1; i++) {
		struct mcase *m = &f->mem[i < nc ? i : 0];
		uint32_t rkey = i < nc ? m->mr->rkey : f->twice->rkey;
		for (size_t k = 0; k < m->len; k++)
			src[k] = (uint8_t)(k * 7 + (size_t)i + 1);
		struct ibv_sge sge = {(uintptr_t)src, (uint32_t)m->len, f->srcmr->lkey};
		struct ibv_send_wr wr = {.wr_id = 100 + (uint64_t)i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					 .send_flags = IBV_SEND_SIGNALED, .wr = {.rdma = {(uintptr_t)m->p, rkey}}}, *bad;
		CHECK(ibv_post_send(f->qpa, &wr, &bad) == 0, "post write %s", m->name);
		tl_expect(f->cqa, IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS, wr.wr_id, NULL);
		/* A Write completes when handed to TCP: read it back, which
		 * RDMAP orders behind the Write. */
		memset(back, 0, m->len);
		struct ibv_sge bs = {(uintptr_t)back, (uint32_t)m->len, f->backmr->lkey};
		struct ibv_send_wr rd = {.wr_id = 200 + (uint64_t)i, .sg_list = &bs, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
					 .send_flags = IBV_SEND_SIGNALED, .wr = {.rdma = {(uintptr_t)m->p, rkey}}};
		CHECK(ibv_post_send(f->qpa, &rd, &bad) == 0, "post read %s", m->name);
		tl_expect(f->cqa, IBV_WC_RDMA_READ, IBV_WC_SUCCESS, rd.wr_id, NULL);
		CHECK(!memcmp(back, src, m->len), "%s: data read back differs", m->name);
		CHECK(!memcmp(m->p, src, m->len), "%s: data not in the application's memory", m->name);
		check_guards(m);
	}
	/* The page both shared-page regions live on holds both writes. */
	CHECK(f->mem[4].p[0] != 0 && f->mem[5].p[63] != 0, "shared page");
}

/* reg-mr-iova: the peer addresses the region from the IOVA given, not
 * from its virtual address. The header's ibv_reg_mr_iova calls
 * ibv_reg_mr_iova when the access flags are a constant without optional
 * bits, else ibv_reg_mr_iova2: one region each. */
static void case_reg_mr_iova(struct fix *f)
{
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	volatile int vaccess = access;
	const uint64_t iovas[2] = {0x5157000000ull + 3, 0x10000};
	uint8_t *src = f->src, *back = f->back;
	for (int k = 0; k < 2; k++) {
		uint8_t *buf = malloc(GUARD + 512 + GUARD);
		CHECK(buf, "malloc");
		struct mcase im = {k ? "iova2" : "iova", buf + GUARD, 512, NULL};
		fill_guards(&im);
		memset(im.p, 0, im.len);
		im.mr = k ? ibv_reg_mr_iova(f->pdb, im.p, im.len, iovas[k], vaccess)
			  : ibv_reg_mr_iova(f->pdb, im.p, im.len, iovas[k], access);
		CHECK(im.mr && im.mr->addr == im.p && im.mr->length == im.len, "%s: region", im.name);
		for (int i = 0; i < 200; i++)
			src[i] = (uint8_t)(0x80 + i + k);
		struct ibv_sge sge = {(uintptr_t)src, 200, f->srcmr->lkey};
		struct ibv_send_wr wr = {.wr_id = 150 + (uint64_t)k, .sg_list = &sge, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
					 .wr = {.rdma = {iovas[k] + 100, im.mr->rkey}}}, *bad;
		CHECK(ibv_post_send(f->qpa, &wr, &bad) == 0, "post write %s", im.name);
		tl_expect(f->cqa, IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS, wr.wr_id, NULL);
		memset(back, 0, 512);
		struct ibv_sge bs = {(uintptr_t)back, 512, f->backmr->lkey};
		struct ibv_send_wr rd = {.wr_id = 250 + (uint64_t)k, .sg_list = &bs, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
					 .wr = {.rdma = {iovas[k], im.mr->rkey}}};
		CHECK(ibv_post_send(f->qpa, &rd, &bad) == 0, "post read %s", im.name);
		tl_expect(f->cqa, IBV_WC_RDMA_READ, IBV_WC_SUCCESS, rd.wr_id, NULL);
		/* Bytes 100..299 of the region, and nothing else, were written. */
		CHECK(!memcmp(im.p + 100, src, 200) && !memcmp(back + 100, src, 200), "%s: data not at IOVA + 100", im.name);
		for (int i = 0; i < 512; i++)
			CHECK((i >= 100 && i < 300) || (im.p[i] == 0 && back[i] == 0), "%s: byte %d written", im.name, i);
		check_guards(&im);
		CHECK(ibv_dereg_mr(im.mr) == 0, "dereg %s", im.name);
		free(buf);
	}
}

/* The inline Send of comp-channel, solicited and post-errors. */
static const char inline_msg[] = "inline send";

static struct ibv_send_wr inline_send(struct ibv_sge *sge, uint64_t id, unsigned flags)
{
	*sge = (struct ibv_sge){(uintptr_t)inline_msg, sizeof(inline_msg), 0};
	return (struct ibv_send_wr){.wr_id = id, .sg_list = sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				    .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE | flags};
}

/* post_recv_b posts a receive of mem[0]'s first 5000 bytes on B's QP. */
static void post_recv_b(struct fix *f, uint64_t id)
{
	struct ibv_sge rs = {(uintptr_t)f->mem[0].p, 5000, f->mem[0].mr->lkey};
	struct ibv_recv_wr rw = {.wr_id = id, .sg_list = &rs, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(f->qpb, &rw, &rbad) == 0, "post recv %lu", (unsigned long)id);
}

/* comp-channel: Send/Receive with a completion channel and poll(2): B
 * arms, A sends inline; the channel's fd readable only after the
 * completion, the event naming B's CQ and its context. */
static void case_comp_channel(struct fix *f)
{
	post_recv_b(f, 7);
	post_recv_b(f, 8);
	post_recv_b(f, 9);
	CHECK(ibv_req_notify_cq(f->cqb, 0) == 0, "req notify");
	struct pollfd pf = {.fd = f->ccb->fd, .events = POLLIN};
	CHECK(poll(&pf, 1, 0) == 0, "channel readable before any completion");
	struct ibv_sge ms;
	struct ibv_send_wr sw = inline_send(&ms, 300, 0), *sbad;
	CHECK(ibv_post_send(f->qpa, &sw, &sbad) == 0, "post inline send");
	CHECK(poll(&pf, 1, 5000) == 1 && (pf.revents & POLLIN), "channel fd not readable after a completion");
	struct ibv_cq *evcq;
	void *evctx;
	CHECK(ibv_get_cq_event(f->ccb, &evcq, &evctx) == 0 && evcq == f->cqb && evctx == f->cb, "get cq event");
	ibv_ack_cq_events(f->cqb, 1);
	struct ibv_wc wc;
	tl_expect(f->cqb, IBV_WC_RECV, IBV_WC_SUCCESS, 7, &wc);
	CHECK(wc.byte_len == sizeof(inline_msg) && !memcmp(f->mem[0].p, inline_msg, sizeof(inline_msg)) &&
		      wc.qp_num == f->qpb->qp_num,
	      "received data");
	tl_expect(f->cqa, IBV_WC_SEND, IBV_WC_SUCCESS, 300, NULL);
}

/* solicited: armed for solicited completions only, an unsolicited Send
 * does not wake the channel, a solicited one does. */
static void case_solicited(struct fix *f)
{
	struct pollfd pf = {.fd = f->ccb->fd, .events = POLLIN};
	CHECK(ibv_req_notify_cq(f->cqb, 1) == 0, "req notify solicited");
	struct ibv_sge ms;
	struct ibv_send_wr sw = inline_send(&ms, 301, 0), *sbad;
	CHECK(ibv_post_send(f->qpa, &sw, &sbad) == 0, "post send");
	tl_expect(f->cqa, IBV_WC_SEND, IBV_WC_SUCCESS, 301, NULL);
	CHECK(poll(&pf, 1, 300) == 0, "channel woke for an unsolicited Send");
	sw = inline_send(&ms, 302, IBV_SEND_SOLICITED);
	CHECK(ibv_post_send(f->qpa, &sw, &sbad) == 0, "post solicited send");
	CHECK(poll(&pf, 1, 5000) == 1, "channel did not wake for a solicited Send");
	struct ibv_cq *evcq;
	void *evctx;
	CHECK(ibv_get_cq_event(f->ccb, &evcq, &evctx) == 0 && evcq == f->cqb, "get cq event 2");
	ibv_ack_cq_events(f->cqb, 1);
	tl_expect(f->cqb, IBV_WC_RECV, IBV_WC_SUCCESS, 8, NULL);
	tl_expect(f->cqb, IBV_WC_RECV, IBV_WC_SUCCESS, 9, NULL);
	tl_expect(f->cqa, IBV_WC_SEND, IBV_WC_SUCCESS, 302, NULL);
}

/* post-errors: bad work requests fail at post with EINVAL, as a
 * provider's do: a window bind naming no window, TSO. */
static void case_post_errors(struct fix *f)
{
	struct ibv_sge ms;
	struct ibv_send_wr badop = inline_send(&ms, 302, IBV_SEND_SOLICITED), *sbad;
	badop.opcode = IBV_WR_BIND_MW; /* naming no window */
	CHECK(ibv_post_send(f->qpa, &badop, &sbad) == EINVAL && sbad == &badop, "bind mw without a window refused");
	badop.opcode = IBV_WR_TSO;
	CHECK(ibv_post_send(f->qpa, &badop, &sbad) == EINVAL && sbad == &badop, "TSO refused");
}

/* terminate-qp-fatal (--terminate): an RDMA WRITE with an rkey B never
 * gave out: B refuses it with a Terminate, both QPs are fatal
 * (IBV_EVENT_QP_FATAL on each side), the connection ends. */
static void case_terminate(struct fix *f)
{
	post_recv_b(f, 10);
	struct ibv_sge ts = {(uintptr_t)f->src, 16, f->srcmr->lkey};
	struct ibv_send_wr tw = {.wr_id = 400, .sg_list = &ts, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr = {.rdma = {(uintptr_t)f->mem[0].p, f->mem[0].mr->rkey ^ 0x7f7f7f00u}}}, *tbad;
	CHECK(ibv_post_send(f->qpa, &tw, &tbad) == 0, "post bad write");
	struct ibv_context *ctxs[2] = {f->aid->verbs, f->bid->verbs};
	for (int i = 0; i < 2; i++) {
		struct pollfd ap = {.fd = ctxs[i]->async_fd, .events = POLLIN};
		CHECK(poll(&ap, 1, 10000) == 1, "no async event on side %c", 'A' + i);
		struct ibv_async_event ae;
		CHECK(ibv_get_async_event(ctxs[i], &ae) == 0, "get async event");
		CHECK(ae.event_type == IBV_EVENT_QP_FATAL && ae.element.qp == (i ? f->qpb : f->qpa), "side %c: event %s",
		      'A' + i, ibv_event_type_str(ae.event_type));
		ibv_ack_async_event(&ae);
	}
}

/* disconnect: A disconnects (with --terminate the Terminate ended the
 * connection already): DISCONNECTED on both sides, B's posted receive
 * flushed. */
static void case_disconnect(struct fix *f)
{
	if (!f->terminate) {
		post_recv_b(f, 10);
		CHECK(rdma_disconnect(f->aid) == 0, "disconnect");
	}
	tl_disconnected(f->cha, f->chb);
	tl_expect(f->cqb, IBV_WC_RECV, IBV_WC_WR_FLUSH_ERR, 10, NULL);
}

/* cq-overflow: sixteen receives flushed at once into a one-entry CQ;
 * polled seldom, so the flush's burst finds it full: IBV_EVENT_CQ_ERR. */
static void case_cq_overflow(struct fix *f)
{
	struct ibv_context *ca = f->ca;
	struct ibv_pd *opd = ibv_alloc_pd(ca);
	struct ibv_cq *ocq = opd ? ibv_create_cq(ca, 1, NULL, NULL, 0) : NULL;
	struct ibv_qp_init_attr oa = {.send_cq = ocq, .recv_cq = ocq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *oqp = ocq ? ibv_create_qp(opd, &oa) : NULL;
	CHECK(oqp, "overflow QP");
	struct ibv_qp_attr ia = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	CHECK(ibv_modify_qp(oqp, &ia, IBV_QP_STATE) == 0, "INIT");
	uint64_t one;
	struct ibv_sge os = {(uintptr_t)&one, sizeof(one), f->srcmr->lkey};
	for (uint64_t k = 0; k < 16; k++) {
		struct ibv_recv_wr orw = {.wr_id = 500 + k, .sg_list = &os, .num_sge = 1}, *rbad;
		CHECK(ibv_post_recv(oqp, &orw, &rbad) == 0, "post recv %lu", (unsigned long)k);
	}
	ia.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(oqp, &ia, IBV_QP_STATE) == 0, "ERR");
	struct pollfd ap = {.fd = ca->async_fd, .events = POLLIN};
	for (int i = 0; i < 200 && poll(&ap, 1, 0) == 0; i++) {
		usleep(50000);
		struct ibv_wc owc;
		CHECK(ibv_poll_cq(ocq, 1, &owc) >= 0, "poll");
	}
	struct ibv_async_event ae;
	CHECK(poll(&ap, 1, 0) == 1 && ibv_get_async_event(ca, &ae) == 0, "no async event on overflow");
	CHECK(ae.event_type == IBV_EVENT_CQ_ERR && ae.element.cq == ocq, "event %s", ibv_event_type_str(ae.event_type));
	ibv_ack_async_event(&ae);
	CHECK(ibv_destroy_qp(oqp) == 0 && ibv_destroy_cq(ocq) == 0 && ibv_dealloc_pd(opd) == 0, "overflow teardown");
}

/* teardown: every object of the run released, every call checked. */
static void case_teardown(struct fix *f)
{
	for (int i = 0; i < 6; i++)
		CHECK(ibv_dereg_mr(f->mem[i].mr) == 0, "dereg %s", f->mem[i].name);
	CHECK(ibv_dereg_mr(f->twice) == 0 && ibv_dereg_mr(f->srcmr) == 0 && ibv_dereg_mr(f->backmr) == 0, "dereg");
	rdma_destroy_qp(f->aid);
	rdma_destroy_qp(f->bid);
	CHECK(ibv_destroy_cq(f->cqa) == 0 && ibv_destroy_cq(f->cqb) == 0, "destroy cq");
	CHECK(ibv_destroy_comp_channel(f->cca) == 0 && ibv_destroy_comp_channel(f->ccb) == 0, "destroy channel");
	CHECK(ibv_dealloc_pd(f->pda) == 0 && ibv_dealloc_pd(f->pdb) == 0, "dealloc pd");
	CHECK(rdma_destroy_id(f->aid) == 0 && rdma_destroy_id(f->bid) == 0 && rdma_destroy_id(f->lid) == 0, "destroy ids");
	rdma_destroy_event_channel(f->cha);
	rdma_destroy_event_channel(f->chb);
	CHECK(ibv_close_device(f->ca) == 0 && ibv_close_device(f->cb) == 0, "close");
	free(f->heap);
	free(f->shared);
	free(f->odd);
	free(f->src);
	free(f->back);
}

/* The modes of a run: which of them a case runs in. */
enum {
	PLAIN = 1,     /* no flag */
	TERMINATE = 2, /* --terminate */
	NO_IMM = 4,    /* --no-imm: B's daemon without RFC 7306 */
	ALL = PLAIN | TERMINATE | NO_IMM,
	IMM = PLAIN | TERMINATE,
};

/* The cases, in the order they run: each relies on what the ones before
 * it set up (devices, then the connection resolve and connect make, then
 * B's memory), so a case is not run alone. */
static const struct tcase {
	const char *name;
	void (*run)(struct fix *f);
	int modes;
	const char *what; /* what the case checks (its function's comment says more) */
} cases[] = {
	{"devices", case_devices, ALL,
	 "both devices open as iWARP RNICs; their addresses"},
	{"queries", case_queries, ALL,
	 "device, port, P_Key and GID queries; the GID table"},
	{"bind-port-0", case_bind_port0, ALL,
	 "a port and the device's PD at bind; listen with backlog 0"},
	{"loopback-bind-options", case_loopback_options, ALL,
	 "a loopback bind; id options and their refusals"},
	{"addrinfo-hints", case_addrinfo_hints, ALL,
	 "rdma_getaddrinfo from hints alone; of nothing, EINVAL"},
	{"disconnect-destroy-qp", case_disconnect_destroy_qp, ALL,
	 "DISCONNECTED on both sides when a QP goes right after rdma_disconnect"},
	{"wildcard-listener", case_wildcard_listener, ALL,
	 "a 0.0.0.0 bind is on no device; its requests come on the device's id"},
	{"resolve", case_resolve, ALL,
	 "B listens, A resolves; A's PD, channel and CQ"},
	{"unsupported", case_unsupported, ALL,
	 "every refused verb and its errno"},
	{"connect", case_connect, ALL,
	 "private data both ways, IRD/ORD, RTS"},
	{"ports", case_ports, ALL,
	 "the three ids' ports and addresses"},
	{"notify", case_notify, ALL,
	 "rdma_notify on connected ids and on one without connection"},
	{"ud", case_ud, ALL,
	 "datagram ids: what needs UD fails with EOPNOTSUPP"},
	{"qp-extras", case_qp_extras, ALL,
	 "no ECE, no extended QP, no in-order placement"},
	{"rdma-devices", case_rdma_devices, ALL,
	 "rdma_get_devices lists both devices"},
	{"reject", case_reject, ALL,
	 "rdma_reject's private data reaches REJECTED"},
	{"memory-registration", case_memory, ALL,
	 "every registration case written and read back, guards untouched"},
	{"reg-mr-iova", case_reg_mr_iova, ALL,
	 "regions addressed by an IOVA"},
	{"rereg-mr", case_rereg, ALL,
	 "ibv_rereg_mr: memory, access, PD, bad input"},
	{"comp-channel", case_comp_channel, ALL,
	 "Send/Receive woken through a completion channel"},
	{"solicited", case_solicited, ALL,
	 "solicited-only arming"},
	{"write-with-imm", case_write_imm, IMM,
	 "RDMA Write with Immediate Data"},
	{"send-with-imm", case_send_imm, IMM,
	 "Send with Immediate Data"},
	{"atomic-fetch-add", case_fetch_add, IMM,
	 "Fetch-and-Add results and the word"},
	{"atomic-cmp-swap", case_cmp_swap, IMM,
	 "Compare-and-Swap, stored and not"},
	{"atomic-post-errors", case_atomic_errors, IMM,
	 "malformed atomics refused at post"},
	{"atomic-unsignaled", case_atomic_unsignaled, IMM,
	 "unsignaled atomics beyond the send queue's depth"},
	{"imm-refused", case_no_imm, NO_IMM,
	 "immediate data toward a peer without RFC 7306: EOPNOTSUPP"},
	{"atomic-refused", case_no_atomic, NO_IMM,
	 "atomics toward a peer without RFC 7306: EOPNOTSUPP"},
	{"post-errors", case_post_errors, ALL,
	 "bad work requests refused at post"},
	{"terminate-qp-fatal", case_terminate, TERMINATE,
	 "a Terminate: IBV_EVENT_QP_FATAL on both sides"},
	{"disconnect", case_disconnect, ALL,
	 "DISCONNECTED on both sides, B's receive flushed"},
	{"cq-overflow", case_cq_overflow, ALL,
	 "a CQ overflowed: IBV_EVENT_CQ_ERR"},
	{"qp-reuse", case_qp_reuse, PLAIN,
	 "a QP through ERR, RESET and INIT, connected again"},
	{"teardown", case_teardown, ALL,
	 "every object released, every call checked"},
};

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "--removal"))
		return removal(argv[2]);
	if (argc == 5 && !strcmp(argv[1], "--rsockets"))
		return rsockets(argv[2], argv[3], atoi(argv[4]));
	int terminate = 0, noimm = 0, list = 0;
	for (; argc > 1 && !strncmp(argv[1], "--", 2); argc--, argv++) {
		if (!strcmp(argv[1], "--terminate"))
			terminate = 1;
		else if (!strcmp(argv[1], "--no-imm"))
			noimm = 1;
		else if (!strcmp(argv[1], "--list"))
			list = 1;
		else
			break;
	}
	CHECK(!(terminate && noimm), "--terminate and --no-imm: one at a time");
	const int mode = terminate ? TERMINATE : noimm ? NO_IMM : PLAIN;
	const int n = (int)(sizeof(cases) / sizeof(cases[0]));
	if (list) {
		for (int i = 0; i < n; i++)
			if (cases[i].modes & mode)
				printf("%s\t%s\n", cases[i].name, cases[i].what);
		return 0;
	}
	CHECK(argc >= 3, "usage: siwtun-ctest [--terminate | --no-imm] [--list] DEV_A DEV_B [PORT] | --removal DEV | "
			 "--rsockets DEV_A DEV_B PORT");
	/* Registered on main's stack, which outlives every case. */
	uint8_t stack[GUARD + 300 + GUARD];
	struct fix f = {.dev_a = argv[1], .dev_b = argv[2], .port = argc > 3 ? atoi(argv[3]) : 17999,
			.terminate = terminate, .stack = stack};
	for (int i = 0; i < n; i++) {
		if (!(cases[i].modes & mode))
			continue;
		cases[i].run(&f);
		OK(cases[i].name);
	}
	printf("PASS\n");
	return 0;
}
