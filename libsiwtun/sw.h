/* libsiwtun internals: a libibverbs/librdmacm-compatible client of a
 * siwtun daemon's verbs socket (see doc/c-programs.md). Everything here is
 * private to the library. */
#ifndef SW_H
#define SW_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "siwtun_abi.h"

#define SW_EXPORT __attribute__((visibility("default")))
#define SW_MAX_ADDRS 4
#define SW_VENDOR_ID 0x736977 /* "siw", as the Go device reports */

/* Removes node from the singly linked list (by ->next) at *head. */
#define SW_UNLINK(head, node)                                                   \
	do {                                                                    \
		for (__typeof__(node) *pp_ = (head); *pp_; pp_ = &(*pp_)->next) \
			if (*pp_ == (node)) {                                   \
				*pp_ = (node)->next;                            \
				break;                                          \
			}                                                       \
	} while (0)

/* ---- messages (msg.c) ---- */

struct sw_enc {
	uint8_t b[SW_MAX_MSG];
	size_t n;
	int err; /* overflow */
};

struct sw_dec {
	const uint8_t *p;
	size_t n;
	int err;
};

void sw_enc_begin(struct sw_enc *e, uint16_t op, uint32_t seq);
void sw_enc_u8(struct sw_enc *e, uint8_t v);
void sw_enc_u16(struct sw_enc *e, uint16_t v);
void sw_enc_u32(struct sw_enc *e, uint32_t v);
void sw_enc_u64(struct sw_enc *e, uint64_t v);
void sw_enc_bytes(struct sw_enc *e, const void *p, size_t n);
/* An address (v4/v6 from a sockaddr) and its port. */
void sw_enc_addr(struct sw_enc *e, const struct sockaddr *sa);
void sw_enc_finish(struct sw_enc *e, int nfds);

uint8_t sw_dec_u8(struct sw_dec *d);
uint16_t sw_dec_u16(struct sw_dec *d);
uint32_t sw_dec_u32(struct sw_dec *d);
uint64_t sw_dec_u64(struct sw_dec *d);
/* A length-prefixed field: its bytes (in the message) and length. */
const uint8_t *sw_dec_bytes(struct sw_dec *d, size_t *n);
/* A length-prefixed field as a string in dst (size bytes, NUL included;
 * longer ones are cut). */
void sw_dec_str(struct sw_dec *d, char *dst, size_t size);
void sw_dec_addr(struct sw_dec *d, struct sockaddr_storage *ss);

/* ---- the verbs socket session (conn.c) ---- */

struct sw_conn;

struct sw_reply {
	uint32_t st;
	char msg[256];
	uint8_t body[SW_MAX_MSG];
	size_t blen;
	int fds[SW_MAX_FDS];
	int nfds;
};

typedef void (*sw_async_cb)(struct sw_conn *c, struct sw_reply *r, void *arg);

struct sw_call {
	uint32_t seq;
	int done;
	struct sw_reply *r;
	sw_async_cb cb; /* async: called on the reader thread */
	void *arg;
	struct sw_call *next;
};

struct sw_conn {
	int fd;
	pthread_t reader;
	int reader_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_mutex_t wmu;
	uint32_t seq;
	struct sw_call *calls;
	int gone;
	char reason[256];
	/* Called on the reader thread. */
	void (*on_event)(struct sw_conn *c, const uint8_t *body, size_t n);
	void (*on_gone)(struct sw_conn *c);
	void *owner;
};

int sw_conn_dial(const char *path, struct sw_conn **out);
/* Start the reader thread (after Hello). */
int sw_conn_start(struct sw_conn *c);
void sw_conn_close(struct sw_conn *c);
/* Send a request (body built by fill into e after sw_enc_begin) and wait
 * for its reply. Returns 0 with r filled (r->st may be an error), or an
 * errno (ENODEV once the daemon is gone). */
int sw_call(struct sw_conn *c, uint16_t op, struct sw_enc *e, const int *fds, int nfds, struct sw_reply *r);
/* Like sw_call, but returns at once; cb runs on the reader thread with the
 * reply (r owned by the library, valid during cb). *seq gets the request
 * number (for OpCancel). */
int sw_call_async(struct sw_conn *c, uint16_t op, struct sw_enc *e, sw_async_cb cb, void *arg, uint32_t *seq);
void sw_cancel(struct sw_conn *c, uint32_t seq);
/* The errno for a reply status. */
int sw_status_errno(const struct sw_reply *r);
void sw_close_fds(struct sw_reply *r);

/* ---- devices and contexts (device.c) ---- */

enum { /* indexes of sw_device.attr (Hello's order) */
	SW_A_VENDOR, SW_A_PART, SW_A_MAX_QP, SW_A_MAX_QP_WR, SW_A_MAX_SGE, SW_A_MAX_SGE_RD,
	SW_A_MAX_CQ, SW_A_MAX_CQE, SW_A_MAX_MR, SW_A_MAX_PD, SW_A_MAX_QP_RD_ATOM,
	SW_A_MAX_QP_INIT_RD_ATOM, SW_A_MAX_INLINE, SW_A_MTU,
	SW_A_MAX_SRQ, SW_A_MAX_SRQ_WR, SW_A_MAX_SRQ_SGE, /* protocol version 4 */
	SW_A_ATOMIC_CAP,                                 /* protocol version 5 */
	SW_A_MAX_MW,                                     /* protocol version 6 */
	SW_A_COUNT
};

struct sw_device {
	struct ibv_device dev; /* first: the application's pointer */
	/* What rdma-core's verbs_device holds after ibv_device (ops,
	 * refcount, list node, sysfs): the real libibverbs' helpers that a
	 * program may still reach with our device (ibv_devinfo calls the
	 * private ibv_query_gid_type) read sysfs there; it points at zeros
	 * so they find no sysfs files instead of crashing. */
	void *rc_ops;
	int rc_refcount;
	void *rc_entry[2];
	void *rc_sysfs;
	uint64_t rc_core_support;

	char sock[512]; /* the verbs socket */
	char ctl[512];  /* the control socket */
	uint64_t guid;
	char fw[64];
	uint32_t attr[SW_A_COUNT]; /* Hello's u32s: vendor, part, limits, atomic_cap, max_mw */
	int mtu;
	char netdev[IF_NAMESIZE]; /* the interface the RNIC sits on (ctl link's netdev) */
	int naddrs;
	struct sockaddr_storage addrs[SW_MAX_ADDRS];
	int prefix[SW_MAX_ADDRS];
	struct sw_device *next;
};


struct sw_async_ev {
	struct ibv_async_event ev;
	struct sw_async_ev *next;
};

struct sw_qp;
struct sw_cq;
struct sw_srq;

struct sw_context {
	struct verbs_context vctx; /* ibv_context is its last field */
	struct sw_device *dev;
	struct sw_conn *conn;
	pthread_mutex_t mu;
	struct sw_qp *qps;
	struct sw_cq *cqs;
	struct sw_srq *srqs;
	struct sw_async_ev *aq, **aq_tail;
	atomic_int removed;
	struct ibv_pd *cm_pd; /* rdma_create_qp without a PD */
	/* verbs_context.priv: rdma-core's private per-context state, which
	 * the real libibverbs' own helpers read when a program reaches them
	 * with our context (ibv_devinfo: ibv_query_gid_type). Zeros: they see
	 * no ioctl support and fall back to sysfs, which is empty. */
	uint64_t rc_priv[512];
};

static inline struct sw_context *to_ctx(struct ibv_context *c)
{
	return (struct sw_context *)((char *)c - offsetof(struct sw_context, vctx.context));
}

struct sw_device **sw_devices(int *n);
/* The device's MAC-like address: its GID (iWARP's form) and node GUID
 * derive from it (device.c). */
void sw_device_mac(const struct sw_device *d, uint8_t mac[6]);
struct sw_device *sw_device_by_name(const char *name);
void sw_async_push(struct sw_context *ctx, enum ibv_event_type type, void *obj);

/* ---- verbs objects (verbs.c) ---- */

struct sw_pd {
	struct ibv_pd pd;
	uint32_t h;
};

struct sw_mr {
	struct ibv_mr mr;
	uint32_t h;
	uint64_t iova;       /* the tagged offset of its first byte (rereg.c) */
	unsigned int access; /* as registered (rereg.c) */
};

/* A memory window (verbs.c): the daemon's handle. */
struct sw_mw {
	struct ibv_mw mw;
	uint32_t h;
};

/* The context ops of memory windows (verbs.c). */
struct ibv_mw *sw_ctx_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int sw_ctx_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind);
int sw_ctx_dealloc_mw(struct ibv_mw *mw);

/* The access flags reg_mr grants for access, or -1 with errno (verbs.c). */
int sw_mr_access(unsigned int access);

struct sw_cq {
	struct ibv_cq cq;
	uint32_t h;
	uint8_t *mem;
	size_t memlen;
	uint32_t count, cons;
	int nfd;
	int overflowed;
	unsigned empty; /* polls in a row that found nothing */
	pthread_spinlock_t lock;
	struct sw_cq *next; /* in the context */
};

/* A shared receive queue: the ring of receives the daemon reads when a
 * Send on one of its QPs needs one (srq.c). */
struct sw_srq {
	struct ibv_srq srq;
	uint32_t h;
	pthread_mutex_t lock; /* posts, and a modify replacing the ring */
	uint8_t *mem;
	size_t memlen;
	uint32_t count, prod;
	uint32_t max_wr;
	uint64_t posted;       /* under lock */
	_Atomic uint64_t done; /* completions of its receives, counted by poll */
	struct sw_srq *next;   /* in the context */
};

struct sw_shadow {
	uint64_t id;
	uint32_t op;
	uint32_t signaled; /* completes on success too (IBV_SEND_SIGNALED or sq_sig_all) */
};

struct sw_cm_id;

struct sw_qp {
	struct ibv_qp qp;
	uint32_t h;
	uint8_t *mem;
	size_t memlen;
	uint8_t *sq, *rq;
	uint32_t sq_count, rq_count;
	int doorbell;
	struct ibv_qp_cap cap;
	int sig_all;
	atomic_int post_ok; /* connected (or ERR): sends may be posted */
	atomic_int inited;  /* INIT or later: receives may be posted */
	atomic_int ext;     /* the RDMAP extensions negotiated (SW_EXT_*) */
	pthread_spinlock_t slock, rlock;
	uint32_t sq_prod, rq_prod;
	struct sw_shadow *sent;
	uint32_t nsent;
	uint64_t s_head, s_tail;
	uint64_t *recvd;
	uint32_t nrecvd;
	uint64_t r_head, r_tail;
	struct sw_srq *srq;  /* the SRQ its receives come from, or NULL */
	struct sw_cm_id *cm; /* the rdma_cm id the QP belongs to */
	struct sw_qp *next;  /* in the context */
};

/* The local and remote address of QP h's connection. Not on the reader
 * thread (it waits for the daemon's reply). */
int sw_qp_addrs(struct sw_context *ctx, uint32_t h, struct sockaddr_storage *local, struct sockaddr_storage *remote);

/* Connection events of a QP (from the reader thread), for rdma_cm. */
void sw_cm_qp_event(struct sw_context *ctx, struct sw_qp *qp, uint32_t type, int status, const void *pdata,
		    size_t pdlen);
void sw_cm_device_removed(struct sw_context *ctx);

/* ---- shared receive queues (srq.c) ---- */

int sw_ctx_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
/* An SRQ event from the daemon (reader thread). */
void sw_srq_event(struct sw_context *ctx, uint32_t h, uint32_t type);

/* ---- shared helpers (verbs.c) ---- */

/* Checks a ring header the daemon formatted: 0 or EPROTO. */
int sw_check_ring(const uint8_t *mem, size_t len, uint32_t count, uint32_t esz);
/* Waits for the daemon to hand back a ring entry (0, or ENOMEM). */
int sw_wait_free(const uint8_t *e);
/* Writes n scatter/gather elements into a ring entry's SGL at s. */
void sw_put_sgl(uint8_t *s, const struct ibv_sge *sg, int n);

/* ---- memory (mem.c) ---- */

/* Makes [addr, addr+len) memory the daemon can map: its pages are backed by
 * the process-wide memfd at file offset = address. Returns 0 or an errno;
 * *fd is the memfd (owned by mem.c). */
int sw_mem_share(void *addr, size_t len, int *fd);

/* ---- misc ---- */

void sw_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
