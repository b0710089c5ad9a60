/* librdmacm over the verbs socket: event channels, ids, address
 * resolution, listen/connect/accept/reject/disconnect. The daemon runs
 * iWARP connection management (TCP, MPA); the library turns its replies
 * and QP events into rdma_cm events. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "sw.h"

int sw_qp_modify_state(struct sw_qp *q, enum ibv_qp_state s);

struct sw_cm_event {
	struct rdma_cm_event ev;
	uint8_t pdata[256];
	struct sw_cm_event *next;
};

struct sw_channel {
	struct rdma_event_channel ch;
	pthread_mutex_t mu;
	struct sw_cm_event *q, **tail;
};

struct sw_cm_id {
	struct rdma_cm_id id;
	struct sw_channel *ch;
	struct sw_context *ctx;
	struct sw_qp *qp;
	uint32_t listener;
	int listening;
	int owns;                  /* listener: the daemon listener is ours to close */
	struct sw_cm_id *delegate; /* listener: a later id on the same port takes the requests */
	int lingering;             /* destroyed listener keeping its port a moment (rdma_destroy_id) */
	struct orphan *orphans;    /* requests that came while lingering */
	int pending; /* async calls in flight that hold this id */
	int destroyed;
	uint32_t get_seq;
	uint32_t req;
	int has_req;
	uint8_t peer_ird, peer_ord;
	int connecting, established, disconnected, removal_sent;
	struct ibv_comp_channel *own_sch, *own_rch; /* rdma_create_qp made the CQs */
	struct ibv_cq *own_scq, *own_rcq;
	int sync;                        /* created without a channel: calls wait for their events */
	struct ibv_qp_init_attr *ep_qp;  /* rdma_create_ep's QP attributes, for rdma_get_request */
	struct ibv_pd *ep_pd;
	/* Events rdma_get_cm_event handed out for the id, and those acked:
	 * rdma_destroy_id waits until they are equal, as librdmacm does, so
	 * no thread still handles an event of an id that is gone. */
	unsigned reported, acked;
	uint32_t port_res; /* the daemon's reservation of the bound port (rdma_bind_addr to port 0) */
	/* Bound to a wildcard or loopback address: rdma_cm binds such an id
	 * to no device (cma_any_addr counts loopback as any), so id->verbs
	 * and id->pd stay NULL until rdma_resolve_addr; libsiwtun still talks
	 * to the device it picked through ctx. libfabric's verbs provider
	 * relies on it: with no device it takes the devices' own addresses
	 * for its passive endpoints, which a peer can reach. */
	int wild;
	int has_port_res;
	struct sw_cm_id *next;
};

/* A connection request that reached a lingering listener. */
struct orphan {
	uint32_t h;
	struct sockaddr_storage remote;
	uint8_t pd[256];
	size_t pdlen;
	uint16_t ird, ord;
	struct orphan *next;
};

/* How long a destroyed listener keeps its port for a new id of the process
 * (see rdma_destroy_id). perftest -R destroys its control listener as it
 * accepts, sleeps 1 s, exchanges its parameters and only then listens for
 * the data connection: 1.2-1.7 s on the 2-core machine, and its client,
 * connecting as soon as it is through the same steps, may come first. */
#define SW_LINGER_MS 3000

/* cm_mu guards the ids' flags and the id list. Lock order: a context's mu,
 * then cm_mu, then a channel's mu. */
static pthread_mutex_t cm_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ack_cv = PTHREAD_COND_INITIALIZER; /* an event acked (with cm_mu) */
static void *linger_main(void *arg);
static void free_own_cqs(struct sw_cm_id *sid);
static void release_port(struct sw_cm_id *sid);
static struct sw_cm_id *ids;

/* The contexts rdma_cm opened, one per device, kept open. */
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	struct sw_device *dev;
	struct ibv_context *ctx;
} cm_ctxs[64];
static int ncm_ctxs;

static struct ibv_context *cm_ctx(struct sw_device *d)
{
	pthread_mutex_lock(&ctx_mu);
	struct ibv_context *c = NULL;
	for (int i = 0; i < ncm_ctxs; i++)
		if (cm_ctxs[i].dev == d)
			c = cm_ctxs[i].ctx;
	if (!c && ncm_ctxs < 64) {
		c = ibv_open_device(&d->dev);
		if (c) {
			cm_ctxs[ncm_ctxs].dev = d;
			cm_ctxs[ncm_ctxs++].ctx = c;
		}
	}
	pthread_mutex_unlock(&ctx_mu);
	return c;
}

static int fail(int err)
{
	errno = err;
	return -1;
}

static socklen_t sa_len(const struct sockaddr *sa)
{
	return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

static int is_any(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
	if (sa->sa_family == AF_INET6)
		return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
	return 1;
}

static int same_ip(const struct sockaddr *a, const struct sockaddr_storage *b)
{
	if (a->sa_family != b->ss_family)
		return 0;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
}

static int in_prefix(const struct sockaddr *a, const struct sockaddr_storage *b, int prefix)
{
	if (a->sa_family != AF_INET || b->ss_family != AF_INET || prefix <= 0)
		return 0;
	uint32_t m = prefix >= 32 ? 0xffffffffu : ~(0xffffffffu >> prefix);
	return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) & m) ==
	       (ntohl(((const struct sockaddr_in *)b)->sin_addr.s_addr) & m);
}

static int is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
	if (sa->sa_family == AF_INET6)
		return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
	return 0;
}

/* The device for an id: the RNIC owning the bound source address; a
 * loopback address binds the first device, as rdma_cm binds loopback to
 * the first device with an active port (cma_bind_loopback; every siwtun
 * port is active while its daemon runs); else the only device (SIWTUN_DEV
 * narrows the list to one); else the one whose subnet holds the
 * destination; else the first. */
static struct sw_device *pick(const struct sockaddr *src, const struct sockaddr *dst, int *err)
{
	int n;
	struct sw_device **l = sw_devices(&n), *d = NULL;
	*err = 0;
	if (!l || n == 0) {
		*err = ENODEV;
		free(l);
		return NULL;
	}
	if (src && is_loopback(src)) {
		d = l[0];
	} else if (src && !is_any(src)) {
		for (int i = 0; i < n && !d; i++)
			for (int j = 0; j < l[i]->naddrs; j++)
				if (same_ip(src, &l[i]->addrs[j]))
					d = l[i];
		if (!d)
			*err = EADDRNOTAVAIL;
	} else if (n == 1) {
		d = l[0];
	} else {
		for (int i = 0; dst && i < n && !d; i++)
			for (int j = 0; j < l[i]->naddrs; j++)
				if (in_prefix(dst, &l[i]->addrs[j], l[i]->prefix[j]))
					d = l[i];
		if (!d)
			d = l[0];
	}
	free(l);
	return d;
}

static int own_addr(const struct sw_device *d, const struct sockaddr *sa, struct sockaddr_storage *out);

/* on_device gives, for a loopback address, the device's own address of
 * that family with sa's port: the RNIC runs its own TCP/IP stack, where
 * "this host" is its own address. Other addresses are copied as they are.
 * Returns 0, or EADDRNOTAVAIL when the device has no address of the
 * family. */
static int on_device(const struct sw_device *d, const struct sockaddr *sa, struct sockaddr_storage *out)
{
	memset(out, 0, sizeof(*out));
	memcpy(out, sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
	if (!is_loopback(sa))
		return 0;
	return own_addr(d, sa, out);
}

/* own_addr puts into out the device's own address of sa's family, with
 * sa's port. */
static int own_addr(const struct sw_device *d, const struct sockaddr *sa, struct sockaddr_storage *out)
{
	for (int i = 0; i < d->naddrs; i++)
		if (d->addrs[i].ss_family == sa->sa_family) {
			in_port_t port = sa->sa_family == AF_INET ? ((const struct sockaddr_in *)sa)->sin_port
								  : ((const struct sockaddr_in6 *)sa)->sin6_port;
			*out = d->addrs[i];
			if (sa->sa_family == AF_INET)
				((struct sockaddr_in *)out)->sin_port = port;
			else
				((struct sockaddr_in6 *)out)->sin6_port = port;
			return 0;
		}
	return EADDRNOTAVAIL;
}

/* ---- events ---- */

static void push(struct sw_cm_id *sid, struct sw_cm_id *listen, enum rdma_cm_event_type type, int status,
		 const void *pdata, size_t pdlen, uint8_t rr, uint8_t id_depth)
{
	if (sid->sync && (type == RDMA_CM_EVENT_ADDR_RESOLVED || type == RDMA_CM_EVENT_ROUTE_RESOLVED))
		return; /* a synchronous resolve has completed */
	struct sw_cm_event *e = calloc(1, sizeof(*e));
	if (!e)
		return;
	e->ev.id = &sid->id;
	e->ev.listen_id = listen ? &listen->id : NULL;
	e->ev.event = type;
	e->ev.status = status;
	if (pdlen > sizeof(e->pdata))
		pdlen = sizeof(e->pdata);
	if (pdlen)
		memcpy(e->pdata, pdata, pdlen);
	e->ev.param.conn.private_data = pdlen ? e->pdata : NULL;
	e->ev.param.conn.private_data_len = (uint8_t)pdlen;
	e->ev.param.conn.responder_resources = rr;
	e->ev.param.conn.initiator_depth = id_depth;
	struct sw_channel *ch = sid->ch;
	pthread_mutex_lock(&ch->mu);
	*ch->tail = e;
	ch->tail = &e->next;
	pthread_mutex_unlock(&ch->mu);
	uint64_t one = 1;
	if (write(ch->ch.fd, &one, sizeof(one)) < 0) {
		/* cannot overflow in practice */
	}
}

SW_EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct sw_channel *ch = calloc(1, sizeof(*ch));
	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	ch->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (ch->ch.fd < 0) {
		free(ch);
		return NULL;
	}
	pthread_mutex_init(&ch->mu, NULL);
	ch->tail = &ch->q;
	return &ch->ch;
}

SW_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	struct sw_channel *ch = (struct sw_channel *)channel;
	close(ch->ch.fd);
	while (ch->q) {
		struct sw_cm_event *e = ch->q;
		ch->q = e->next;
		free(e);
	}
	pthread_mutex_destroy(&ch->mu);
	free(ch);
}

/* learn_local_port gives a connecting id, once ESTABLISHED, the local
 * address and port of its TCP connection (the daemon picks the port at
 * connect time; rdma_cm binds one at rdma_resolve_addr): rdma_get_src_port
 * and rdma_get_local_addr then say what the peer sees. On the application's
 * thread, as the query waits for the daemon. */
static void learn_local_port(struct sw_cm_id *sid)
{
	if (!sid->ctx || rdma_get_src_port(&sid->id) != 0)
		return;
	uint32_t h = 0;
	int have = 0;
	pthread_mutex_lock(&sid->ctx->mu);
	if (sid->qp) {
		h = sid->qp->h;
		have = 1;
	}
	pthread_mutex_unlock(&sid->ctx->mu);
	struct sockaddr_storage local, remote;
	if (!have || sw_qp_addrs(sid->ctx, h, &local, &remote) || local.ss_family != sid->id.route.addr.src_addr.sa_family)
		return;
	memcpy(&sid->id.route.addr.src_storage, &local, sizeof(local));
}

/* counted is the id an event counts against until acked (rdma_destroy_id
 * waits for it): a connection request's listener, as librdmacm counts it,
 * else the event's id. */
static struct sw_cm_id *counted(const struct rdma_cm_event *ev)
{
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->listen_id)
		return (struct sw_cm_id *)ev->listen_id;
	return (struct sw_cm_id *)ev->id;
}

SW_EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	struct sw_channel *ch = (struct sw_channel *)channel;
	uint64_t v;
	if (read(ch->ch.fd, &v, sizeof(v)) != sizeof(v))
		return -1; /* errno: EAGAIN on a non-blocking channel, EINTR */
	pthread_mutex_lock(&ch->mu);
	struct sw_cm_event *e = ch->q;
	if (e) {
		ch->q = e->next;
		if (!ch->q)
			ch->tail = &ch->q;
	}
	pthread_mutex_unlock(&ch->mu);
	if (!e)
		return fail(EAGAIN);
	pthread_mutex_lock(&cm_mu);
	counted(&e->ev)->reported++;
	pthread_mutex_unlock(&cm_mu);
	if (e->ev.event == RDMA_CM_EVENT_ESTABLISHED)
		learn_local_port((struct sw_cm_id *)e->ev.id);
	*event = &e->ev;
	return 0;
}

SW_EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	pthread_mutex_lock(&cm_mu);
	counted(event)->acked++;
	pthread_cond_broadcast(&ack_cv);
	pthread_mutex_unlock(&cm_mu);
	free((struct sw_cm_event *)event);
	return 0;
}

SW_EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const names[] = {
		"RDMA_CM_EVENT_ADDR_RESOLVED", "RDMA_CM_EVENT_ADDR_ERROR", "RDMA_CM_EVENT_ROUTE_RESOLVED",
		"RDMA_CM_EVENT_ROUTE_ERROR", "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
		"RDMA_CM_EVENT_CONNECT_ERROR", "RDMA_CM_EVENT_UNREACHABLE", "RDMA_CM_EVENT_REJECTED",
		"RDMA_CM_EVENT_ESTABLISHED", "RDMA_CM_EVENT_DISCONNECTED", "RDMA_CM_EVENT_DEVICE_REMOVAL",
		"RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
		"RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};
	if ((unsigned)event < sizeof(names) / sizeof(names[0]))
		return names[event];
	return "UNKNOWN EVENT";
}

/* ---- ids ---- */

SW_EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
			     enum rdma_port_space ps)
{
	/* As rdma_cm, which makes the id before any device is chosen: the
	 * datagram port spaces give UD ids, which fail once they need the
	 * device's UD service (rdma_listen, rdma_connect, rdma_create_qp:
	 * EOPNOTSUPP, see is_ud); another port space is EINVAL. */
	if (ps != RDMA_PS_TCP && ps != RDMA_PS_IB && ps != RDMA_PS_UDP && ps != RDMA_PS_IPOIB)
		return fail(EINVAL);
	struct sw_cm_id *sid = calloc(1, sizeof(*sid));
	if (!sid)
		return fail(ENOMEM);
	if (!channel) {
		/* Synchronous: the id's own channel, which its calls wait on. */
		channel = rdma_create_event_channel();
		if (!channel) {
			free(sid);
			return -1;
		}
		sid->sync = 1;
	}
	sid->ch = (struct sw_channel *)channel;
	sid->id.channel = channel;
	sid->id.context = context;
	sid->id.ps = ps;
	sid->id.qp_type = ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
	sid->id.port_num = 1;
	pthread_mutex_lock(&cm_mu);
	sid->next = ids;
	ids = sid;
	pthread_mutex_unlock(&cm_mu);
	*id = &sid->id;
	return 0;
}

/* is_ud: an id of a datagram port space (RDMA_PS_UDP, RDMA_PS_IPOIB). An
 * iWARP RNIC has no UD service: RDMAP (RFC 5040) runs over DDP over MPA
 * over TCP, connection-oriented only, and Linux's siw refuses any QP but
 * RC (EOPNOTSUPP). Calls that need it fail with EOPNOTSUPP rather than
 * listen for or make connections that could never carry datagrams. */
static int is_ud(const struct rdma_cm_id *id) { return id->qp_type == IBV_QPT_UD; }

/* purge_events drops the events of sid its channel still holds, not yet
 * retrieved: the id is going, and rdma_get_cm_event must not hand out an
 * event naming it (rdma_cm discards them too). Each took one count of the
 * channel's eventfd (a semaphore), given back here. */
static void purge_events(struct sw_cm_id *sid)
{
	struct sw_channel *ch = sid->ch;
	if (!ch)
		return;
	int n = 0;
	pthread_mutex_lock(&ch->mu);
	for (struct sw_cm_event **pp = &ch->q; *pp;) {
		struct sw_cm_event *e = *pp;
		if (e->ev.id == &sid->id) {
			*pp = e->next;
			free(e);
			n++;
		} else {
			pp = &e->next;
		}
	}
	ch->tail = &ch->q;
	while (*ch->tail)
		ch->tail = &(*ch->tail)->next;
	pthread_mutex_unlock(&ch->mu);
	for (uint64_t v; n > 0; n--) {
		struct pollfd p = {.fd = ch->ch.fd, .events = POLLIN};
		if (poll(&p, 1, 0) != 1 || read(ch->ch.fd, &v, sizeof(v)) != sizeof(v))
			break;
	}
}

/* Frees an id no async call holds any more (cm_mu held). */
static void unlink_free(struct sw_cm_id *sid)
{
	SW_UNLINK(&ids, sid);
	free(sid);
}

static void detach_qp(struct sw_cm_id *sid)
{
	if (!sid->qp || !sid->ctx)
		return;
	pthread_mutex_lock(&sid->ctx->mu);
	if (sid->qp && sid->qp->cm == sid)
		sid->qp->cm = NULL;
	sid->qp = NULL;
	pthread_mutex_unlock(&sid->ctx->mu);
}

SW_EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	struct sw_enc e;
	struct sw_reply r;
	int close_it = 0;
	if (sid->listening && sid->ctx) {
		pthread_mutex_lock(&cm_mu);
		sid->listening = 0;
		if (sid->owns && sid->delegate && !sid->delegate->destroyed) {
			sid->delegate->owns = 1; /* the request loop moves to it */
		} else if (sid->owns) {
			close_it = 1;
		} else {
			for (struct sw_cm_id *o = ids; o; o = o->next)
				if (o->delegate == sid)
					o->delegate = NULL;
		}
		pthread_mutex_unlock(&cm_mu);
	}
	if (close_it) {
		/* The daemon's listener stays for SW_LINGER_MS, for a new id of
		 * this process on the same port (perftest -R destroys its control
		 * listener, then listens again for the data connection, which
		 * its client may already be making): requests wait, and go to
		 * that id, or are rejected when the time is up. */
		pthread_t th;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		pthread_mutex_lock(&cm_mu);
		sid->lingering = 1;
		sid->pending++;
		pthread_mutex_unlock(&cm_mu);
		if (pthread_create(&th, &at, linger_main, sid)) {
			pthread_mutex_lock(&cm_mu);
			sid->lingering = 0;
			sid->pending--;
			pthread_mutex_unlock(&cm_mu);
			sw_cancel(sid->ctx->conn, sid->get_seq);
			sw_enc_begin(&e, 0, 0);
			sw_enc_u32(&e, sid->listener);
			if (!sw_call(sid->ctx->conn, SW_OP_CLOSE_LISTENER, &e, NULL, 0, &r))
				sw_close_fds(&r);
		}
		pthread_attr_destroy(&at);
	}
	if (sid->has_req && sid->ctx) {
		sid->has_req = 0;
		sw_enc_begin(&e, 0, 0);
		sw_enc_u32(&e, sid->req);
		sw_enc_bytes(&e, NULL, 0);
		if (!sw_call(sid->ctx->conn, SW_OP_REJECT, &e, NULL, 0, &r))
			sw_close_fds(&r);
	}
	release_port(sid);
	if (id->event) { /* kept by a synchronous call (sync_wait, rdma_get_request) */
		rdma_ack_cm_event(id->event);
		id->event = NULL;
	}
	detach_qp(sid);
	free_own_cqs(sid);
	free(sid->ep_qp);
	sid->ep_qp = NULL;
	purge_events(sid);
	pthread_mutex_lock(&cm_mu);
	/* As librdmacm: the events of the id the program took must be acked
	 * first (another thread may be handling one). */
	while (sid->acked != sid->reported)
		pthread_cond_wait(&ack_cv, &cm_mu);
	sid->destroyed = 1;
	struct sw_channel *own = sid->sync && !sid->pending ? sid->ch : NULL;
	if (!sid->pending)
		unlink_free(sid);
	pthread_mutex_unlock(&cm_mu);
	if (own)
		rdma_destroy_event_channel(&own->ch);
	return 0;
}

/* cm_pd is the device's PD that rdma_cm gives every id bound to the device
 * (id->pd, as librdmacm sets it when it binds an id to a device: programs
 * create their QPs and regions in it), allocated once per context. */
static struct ibv_pd *cm_pd(struct sw_context *ctx)
{
	pthread_mutex_lock(&ctx_mu);
	if (!ctx->cm_pd)
		ctx->cm_pd = ibv_alloc_pd(&ctx->vctx.context);
	struct ibv_pd *pd = ctx->cm_pd;
	pthread_mutex_unlock(&ctx_mu);
	return pd;
}

static int set_ctx(struct sw_cm_id *sid, struct sw_device *d)
{
	struct ibv_context *c = cm_ctx(d);
	if (!c)
		return errno ? errno : ENODEV;
	struct ibv_pd *pd = cm_pd(to_ctx(c));
	if (!pd)
		return errno ? errno : ENOMEM;
	sid->ctx = to_ctx(c);
	sid->id.verbs = c;
	sid->id.pd = pd;
	return 0;
}

/* release_port gives back the port rdma_bind_addr reserved, once a
 * listener holds it or the id goes. */
static void release_port(struct sw_cm_id *sid)
{
	if (!sid->has_port_res || !sid->ctx)
		return;
	sid->has_port_res = 0;
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, sid->port_res);
	if (!sw_call(sid->ctx->conn, SW_OP_RELEASE_PORT, &e, NULL, 0, &r))
		sw_close_fds(&r);
}

static in_port_t port_of(const struct sockaddr *sa)
{
	return sa->sa_family == AF_INET6 ? ((const struct sockaddr_in6 *)sa)->sin6_port
					 : ((const struct sockaddr_in *)sa)->sin_port;
}

static void set_port(struct sockaddr *sa, in_port_t port)
{
	if (sa->sa_family == AF_INET6)
		((struct sockaddr_in6 *)sa)->sin6_port = port;
	else
		((struct sockaddr_in *)sa)->sin_port = port;
}

/* reserve_port asks the daemon for a port of the RNIC on addr (port 0),
 * as rdma_cm assigns one at bind: programs read it with rdma_get_src_port
 * before they listen (qperf sends it to its client). */
static int reserve_port(struct sw_cm_id *sid, struct sockaddr *addr)
{
	struct sockaddr_storage on;
	int err = on_device(sid->ctx->dev, addr, &on);
	if (err)
		return err;
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_addr(&e, (struct sockaddr *)&on);
	err = sw_call(sid->ctx->conn, SW_OP_RESERVE_PORT, &e, NULL, 0, &r);
	if (err)
		return err;
	sw_close_fds(&r);
	if (r.st != SW_ST_OK) {
		if (getenv("SIWTUN_DEBUG"))
			sw_log("rdma_bind_addr: %s", r.msg);
		return strstr(r.msg, "in use") || strstr(r.msg, "reserved") ? EADDRINUSE : sw_status_errno(&r);
	}
	struct sw_dec d = {r.body, r.blen, 0};
	uint32_t h = sw_dec_u32(&d);
	struct sockaddr_storage got;
	sw_dec_addr(&d, &got);
	if (d.err)
		return EPROTO;
	sid->port_res = h;
	sid->has_port_res = 1;
	set_port(addr, port_of((struct sockaddr *)&got));
	return 0;
}

SW_EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (!addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
		return fail(EAFNOSUPPORT);
	if (sid->ctx)
		return fail(EINVAL); /* bound already, as rdma_cm: only an idle id binds */
	int err;
	struct sw_device *d = pick(addr, NULL, &err);
	if (!d)
		return fail(err);
	if ((err = set_ctx(sid, d)))
		return fail(err);
	struct sockaddr_storage a;
	memset(&a, 0, sizeof(a));
	memcpy(&a, addr, sa_len(addr));
	if (port_of(addr) == 0 && (err = reserve_port(sid, (struct sockaddr *)&a))) {
		sid->ctx = NULL; /* still idle: it may bind again */
		id->verbs = NULL;
		id->pd = NULL;
		return fail(err);
	}
	memcpy(&id->route.addr.src_storage, &a, sa_len(addr));
	if (is_any(addr) || is_loopback(addr)) {
		sid->wild = 1;
		id->verbs = NULL;
		id->pd = NULL;
	}
	return 0;
}

SW_EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst, int timeout_ms)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	(void)timeout_ms;
	if (!dst || (dst->sa_family != AF_INET && dst->sa_family != AF_INET6))
		return fail(EAFNOSUPPORT);
	int err;
	struct sw_device *d = sid->ctx ? sid->ctx->dev : pick(src, dst, &err);
	if (!d)
		return fail(err);
	if (!sid->ctx && (err = set_ctx(sid, d)))
		return fail(err);
	if (sid->wild) {
		/* Resolving binds the id to its device, as rdma_cm does. */
		sid->wild = 0;
		id->verbs = &sid->ctx->vctx.context;
		id->pd = cm_pd(sid->ctx);
	}
	if (src && !is_any(src)) {
		memcpy(&id->route.addr.src_storage, src, sa_len(src));
	} else if (is_any(&id->route.addr.src_addr)) {
		for (int i = 0; i < d->naddrs; i++)
			if (d->addrs[i].ss_family == dst->sa_family) {
				memcpy(&id->route.addr.src_storage, &d->addrs[i], sizeof(d->addrs[i]));
				break;
			}
	}
	memcpy(&id->route.addr.dst_storage, dst, sa_len(dst));
	push(sid, NULL, RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL, 0, 0, 0);
	return 0;
}

SW_EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	(void)timeout_ms;
	if (!sid->ctx)
		return fail(EINVAL);
	push(sid, NULL, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL, 0, 0, 0);
	return 0;
}

static void get_request(struct sw_cm_id *sid);

/* deliver makes the child id of a connection request on listener l and
 * queues CONNECT_REQUEST. */
static void deliver(struct sw_cm_id *l, uint32_t h, const struct sockaddr_storage *remote, const uint8_t *pd,
		    size_t pdlen, uint16_t ird, uint16_t ord)
{
	struct sw_cm_id *child = calloc(1, sizeof(*child));
	if (!child)
		return;
	child->ch = l->ch;
	child->ctx = l->ctx;
	child->id.verbs = &l->ctx->vctx.context; /* a wildcard listener's is NULL */
	child->id.pd = cm_pd(l->ctx);
	child->id.channel = l->id.channel;
	child->id.context = l->id.context;
	child->id.ps = l->id.ps;
	child->id.qp_type = IBV_QPT_RC;
	child->id.port_num = 1;
	child->id.route.addr.src_storage = l->id.route.addr.src_storage;
	if ((is_any(&child->id.route.addr.src_addr) || is_loopback(&child->id.route.addr.src_addr)) &&
	    l->ctx->dev->naddrs) {
		in_port_t port = ((struct sockaddr_in *)&l->id.route.addr.src_storage)->sin_port;
		child->id.route.addr.src_storage = l->ctx->dev->addrs[0];
		((struct sockaddr_in *)&child->id.route.addr.src_storage)->sin_port = port;
	}
	child->id.route.addr.dst_storage = *remote;
	child->req = h;
	child->has_req = 1;
	child->peer_ird = (uint8_t)(ird > 255 ? 255 : ird);
	child->peer_ord = (uint8_t)(ord > 255 ? 255 : ord);
	pthread_mutex_lock(&cm_mu);
	child->next = ids;
	ids = child;
	pthread_mutex_unlock(&cm_mu);
	/* The peer's ORD is what it asks of our responder resources, its IRD
	 * what our initiator depth may use. */
	push(child, l, RDMA_CM_EVENT_CONNECT_REQUEST, 0, pd, pdlen, child->peer_ord, child->peer_ird);
}

static void on_request(struct sw_conn *c, struct sw_reply *r, void *arg)
{
	(void)c;
	struct sw_cm_id *owner = arg, *l;
	pthread_mutex_lock(&cm_mu);
	owner->pending--;
	/* Requests go to the newest id listening on the port (see rdma_listen);
	 * the loop continues on whichever id still owns the listener. A
	 * destroyed listener that lingers keeps the loop, and the requests. */
	l = owner->delegate && !owner->delegate->destroyed ? owner->delegate : owner;
	int alive = !l->destroyed && l->listening;
	int linger = !alive && l == owner && owner->lingering;
	struct sw_cm_id *loop = NULL;
	if (alive)
		loop = owner->destroyed ? l : owner;
	else if (linger)
		loop = owner;
	if (owner->destroyed && !owner->pending)
		unlink_free(owner);
	pthread_mutex_unlock(&cm_mu);
	sw_close_fds(r);
	if (!loop)
		return;
	if (r->st != SW_ST_OK) {
		if (r->st != SW_ST_REMOVED && r->st != SW_ST_CANCELED && r->st != SW_ST_BAD_HANDLE)
			sw_log("rdma_listen: waiting for connection requests: %s", r->msg);
		return;
	}
	struct sw_dec d = {r->body, r->blen, 0};
	uint32_t h = sw_dec_u32(&d);
	struct sockaddr_storage remote;
	sw_dec_addr(&d, &remote);
	size_t pdlen;
	const uint8_t *pd = sw_dec_bytes(&d, &pdlen);
	uint16_t ird = sw_dec_u16(&d), ord = sw_dec_u16(&d);
	if (!d.err) {
		pthread_mutex_lock(&cm_mu);
		if (owner->lingering && !owner->delegate) {
			struct orphan *o = calloc(1, sizeof(*o));
			if (o) {
				o->h = h;
				o->remote = remote;
				o->pdlen = pdlen > sizeof(o->pd) ? sizeof(o->pd) : pdlen;
				if (o->pdlen)
					memcpy(o->pd, pd, o->pdlen);
				o->ird = ird;
				o->ord = ord;
				struct orphan **pp = &owner->orphans;
				while (*pp)
					pp = &(*pp)->next;
				*pp = o;
			}
			pthread_mutex_unlock(&cm_mu);
		} else {
			if (owner->delegate && !owner->delegate->destroyed)
				l = owner->delegate;
			pthread_mutex_unlock(&cm_mu);
			deliver(l, h, &remote, pd, pdlen, ird, ord);
		}
	}
	get_request(loop);
}

/* linger_main closes a destroyed listener's daemon listener after
 * SW_LINGER_MS unless a new id of the process took it over, and rejects the
 * requests that came meanwhile. */
static void *linger_main(void *arg)
{
	struct sw_cm_id *sid = arg;
	struct timespec ts = {SW_LINGER_MS / 1000, (SW_LINGER_MS % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
	}
	pthread_mutex_lock(&cm_mu);
	int adopted = sid->delegate != NULL;
	sid->lingering = 0;
	struct orphan *o = sid->orphans;
	sid->orphans = NULL;
	pthread_mutex_unlock(&cm_mu);
	struct sw_enc e;
	struct sw_reply r;
	if (!adopted) {
		sw_cancel(sid->ctx->conn, sid->get_seq);
		sw_enc_begin(&e, 0, 0);
		sw_enc_u32(&e, sid->listener);
		if (!sw_call(sid->ctx->conn, SW_OP_CLOSE_LISTENER, &e, NULL, 0, &r))
			sw_close_fds(&r);
	}
	while (o) {
		struct orphan *n = o->next;
		sw_enc_begin(&e, 0, 0);
		sw_enc_u32(&e, o->h);
		sw_enc_bytes(&e, NULL, 0);
		if (!sw_call(sid->ctx->conn, SW_OP_REJECT, &e, NULL, 0, &r))
			sw_close_fds(&r);
		free(o);
		o = n;
	}
	pthread_mutex_lock(&cm_mu);
	sid->pending--;
	if (sid->destroyed && !sid->pending)
		unlink_free(sid);
	pthread_mutex_unlock(&cm_mu);
	return NULL;
}

static void get_request(struct sw_cm_id *l)
{
	struct sw_enc e;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, l->listener);
	pthread_mutex_lock(&cm_mu);
	l->pending++;
	pthread_mutex_unlock(&cm_mu);
	if (sw_call_async(l->ctx->conn, SW_OP_GET_REQUEST, &e, on_request, l, &l->get_seq) > 0) {
		pthread_mutex_lock(&cm_mu);
		l->pending--;
		pthread_mutex_unlock(&cm_mu);
	}
}

SW_EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (is_ud(id))
		return fail(EOPNOTSUPP);
	if (!sid->ctx)
		return fail(EINVAL);
	/* A second id of this process listening on the same port (perftest
	 * -R: its control listener stays while the data listener binds the
	 * same port, which rdma_cm allows): the daemon's listener is shared
	 * and its requests go to the newest id. */
	pthread_mutex_lock(&cm_mu);
	for (struct sw_cm_id *o = ids; o; o = o->next)
		if (o->lingering && !o->delegate && o->ctx == sid->ctx && rdma_get_src_port(&o->id) == rdma_get_src_port(id) &&
		    rdma_get_src_port(id) != 0) {
			/* Take over a listener this process destroyed a moment ago,
			 * with the requests that came meanwhile. */
			o->delegate = sid;
			o->lingering = 0;
			sid->listener = o->listener;
			sid->listening = 1;
			sid->owns = 1;
			struct orphan *or = o->orphans;
			o->orphans = NULL;
			pthread_mutex_unlock(&cm_mu);
			while (or) {
				struct orphan *n = or->next;
				deliver(sid, or->h, &or->remote, or->pd, or->pdlen, or->ird, or->ord);
				free(or);
				or = n;
			}
			return 0;
		}
	for (struct sw_cm_id *o = ids; o; o = o->next)
		if (o != sid && o->ctx == sid->ctx && o->listening && o->owns && !o->destroyed && !o->delegate &&
		    rdma_get_src_port(&o->id) == rdma_get_src_port(id) && rdma_get_src_port(id) != 0) {
			o->delegate = sid;
			sid->listener = o->listener;
			sid->listening = 1;
			pthread_mutex_unlock(&cm_mu);
			return 0;
		}
	pthread_mutex_unlock(&cm_mu);
	struct sw_enc e;
	struct sw_reply r;
	struct sockaddr_storage on;
	int lerr = on_device(sid->ctx->dev, &id->route.addr.src_addr, &on);
	if (lerr)
		return fail(lerr);
	sw_enc_begin(&e, 0, 0);
	sw_enc_addr(&e, (struct sockaddr *)&on);
	/* 0 (and less) is the daemon's default backlog, as listen(2)'s. */
	sw_enc_u32(&e, backlog > 0 ? (uint32_t)backlog : 0);
	int err = sw_call(sid->ctx->conn, SW_OP_LISTEN, &e, NULL, 0, &r);
	if (err)
		return fail(err);
	sw_close_fds(&r);
	if (r.st != SW_ST_OK) {
		if (getenv("SIWTUN_DEBUG"))
			sw_log("rdma_listen: %s", r.msg);
		return fail(strstr(r.msg, "in use") ? EADDRINUSE : sw_status_errno(&r));
	}
	struct sw_dec d = {r.body, r.blen, 0};
	sid->listener = sw_dec_u32(&d);
	struct sockaddr_storage bound;
	sw_dec_addr(&d, &bound);
	if (bound.ss_family == id->route.addr.src_addr.sa_family && bound.ss_family == AF_INET)
		id->route.addr.src_sin.sin_port = ((struct sockaddr_in *)&bound)->sin_port;
	else if (bound.ss_family == AF_INET6 && id->route.addr.src_addr.sa_family == AF_INET6)
		id->route.addr.src_sin6.sin6_port = ((struct sockaddr_in6 *)&bound)->sin6_port;
	sid->listening = 1;
	sid->owns = 1;
	release_port(sid); /* the listener holds the port now */
	get_request(sid);
	return 0;
}

/* sync_wait waits on a synchronous id's channel for want; an error event
 * becomes -1 with its errno. */
static int sync_wait(struct sw_cm_id *sid, enum rdma_cm_event_type want)
{
	for (;;) {
		/* The last event stays in id->event until the id's next
		 * synchronous call or its destruction, as librdmacm keeps it:
		 * programs read the peer's private data there (rdma_xclient). */
		if (sid->id.event) {
			rdma_ack_cm_event(sid->id.event);
			sid->id.event = NULL;
		}
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(&sid->ch->ch, &ev))
			return -1;
		sid->id.event = ev;
		enum rdma_cm_event_type t = ev->event;
		int st = ev->status;
		if (t == want)
			return 0;
		switch (t) {
		case RDMA_CM_EVENT_REJECTED:
			return fail(ECONNREFUSED);
		case RDMA_CM_EVENT_UNREACHABLE:
			return fail(ETIMEDOUT);
		case RDMA_CM_EVENT_CONNECT_ERROR:
		case RDMA_CM_EVENT_ADDR_ERROR:
		case RDMA_CM_EVENT_ROUTE_ERROR:
			return fail(st < 0 ? -st : EIO);
		case RDMA_CM_EVENT_DEVICE_REMOVAL:
			return fail(ENODEV);
		default:
			break; /* not what this call waits for */
		}
	}
}

static uint16_t clamp_rd(struct sw_cm_id *sid, unsigned v)
{
	unsigned max = sid->ctx->dev->attr[SW_A_MAX_QP_RD_ATOM];
	return (uint16_t)(v > max ? max : v);
}

static struct sw_qp *qp_of(struct sw_cm_id *sid, struct rdma_conn_param *p)
{
	if (sid->qp)
		return sid->qp;
	if (!p || !p->qp_num)
		return NULL;
	/* A QP the application created itself (rping -q): by number. */
	pthread_mutex_lock(&sid->ctx->mu);
	struct sw_qp *q = sid->ctx->qps;
	while (q && q->qp.qp_num != p->qp_num)
		q = q->next;
	if (q) {
		q->cm = sid;
		sid->qp = q;
	}
	pthread_mutex_unlock(&sid->ctx->mu);
	return q;
}

/* Records the extensions of a Connect's or Accept's reply (Established). */
static void store_ext(struct sw_qp *q, const struct sw_reply *r)
{
	struct sw_dec d = {r->body, r->blen, 0};
	uint8_t ext = sw_dec_u8(&d);
	if (!d.err)
		atomic_store(&q->ext, ext);
}

static void on_connect(struct sw_conn *c, struct sw_reply *r, void *arg)
{
	(void)c;
	struct sw_cm_id *sid = arg;
	sw_close_fds(r);
	pthread_mutex_lock(&cm_mu);
	sid->pending--;
	if (sid->destroyed) {
		if (!sid->pending)
			unlink_free(sid);
		pthread_mutex_unlock(&cm_mu);
		return;
	}
	if (r->st == SW_ST_OK) {
		if (sid->qp) {
			store_ext(sid->qp, r);
			atomic_store(&sid->qp->inited, 1);
			atomic_store(&sid->qp->post_ok, 1);
			sid->qp->qp.state = IBV_QPS_RTS;
		}
		/* ESTABLISHED comes with the QP's Established event, which
		 * carries the peer's accept private data (libfabric's verbs
		 * provider reads its peer's address there); it may come before
		 * or after this reply. */
		pthread_mutex_unlock(&cm_mu);
		return;
	}
	sid->connecting = 0;
	pthread_mutex_unlock(&cm_mu);
	if (r->st == SW_ST_REMOVED)
		return; /* DEVICE_REMOVAL says it */
	int err = sw_status_errno(r);
	if (r->st == SW_ST_REJECTED) {
		struct sw_dec d = {r->body, r->blen, 0};
		size_t n;
		const uint8_t *pd = sw_dec_bytes(&d, &n);
		push(sid, NULL, RDMA_CM_EVENT_REJECTED, -ECONNREFUSED, pd, n, 0, 0);
	} else if (err == ECONNREFUSED || err == ECONNRESET) {
		push(sid, NULL, RDMA_CM_EVENT_REJECTED, -err, NULL, 0, 0, 0);
	} else if (err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH) {
		push(sid, NULL, RDMA_CM_EVENT_UNREACHABLE, -err, NULL, 0, 0, 0);
	} else {
		push(sid, NULL, RDMA_CM_EVENT_CONNECT_ERROR, -err, NULL, 0, 0, 0);
	}
}

SW_EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (is_ud(id))
		return fail(EOPNOTSUPP);
	if (!sid->ctx)
		return fail(EINVAL);
	struct sw_qp *q = qp_of(sid, p);
	if (!q)
		return fail(EINVAL);
	unsigned max = sid->ctx->dev->attr[SW_A_MAX_QP_RD_ATOM];
	struct sockaddr_storage dst;
	/* A wildcard destination is this host, as rdma_cm resolves it
	 * (cma_resolve_loopback): the RNIC's own address. */
	int derr = is_any(&id->route.addr.dst_addr) ? own_addr(sid->ctx->dev, &id->route.addr.dst_addr, &dst)
						    : on_device(sid->ctx->dev, &id->route.addr.dst_addr, &dst);
	if (derr)
		return fail(derr);
	if (sid->has_port_res) {
		/* The daemon picks the connection's own port: the one bound
		 * goes back, and ESTABLISHED reports the real one. */
		release_port(sid);
		set_port(&id->route.addr.src_addr, 0);
	}
	struct sw_enc e;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, q->h);
	sw_enc_addr(&e, (struct sockaddr *)&dst);
	sw_enc_bytes(&e, p ? p->private_data : NULL, p && p->private_data ? p->private_data_len : 0);
	sw_enc_u16(&e, clamp_rd(sid, p ? p->responder_resources : max));
	sw_enc_u16(&e, clamp_rd(sid, p ? p->initiator_depth : max));
	pthread_mutex_lock(&cm_mu);
	sid->pending++;
	sid->connecting = 1;
	pthread_mutex_unlock(&cm_mu);
	int err = sw_call_async(sid->ctx->conn, SW_OP_CONNECT, &e, on_connect, sid, NULL);
	if (err > 0) {
		pthread_mutex_lock(&cm_mu);
		sid->pending--;
		sid->connecting = 0;
		pthread_mutex_unlock(&cm_mu);
		return fail(err);
	}
	return sid->sync ? sync_wait(sid, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

SW_EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (!sid->has_req)
		return fail(EINVAL);
	struct sw_qp *q = qp_of(sid, p);
	if (!q)
		return fail(EINVAL);
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, sid->req);
	sw_enc_u32(&e, q->h);
	sw_enc_bytes(&e, p ? p->private_data : NULL, p && p->private_data ? p->private_data_len : 0);
	sw_enc_u16(&e, clamp_rd(sid, p ? p->responder_resources : sid->peer_ord));
	sw_enc_u16(&e, clamp_rd(sid, p ? p->initiator_depth : sid->peer_ird));
	pthread_mutex_lock(&cm_mu);
	sid->connecting = 1;
	pthread_mutex_unlock(&cm_mu);
	int err = sw_call(sid->ctx->conn, SW_OP_ACCEPT, &e, NULL, 0, &r);
	if (!err) {
		sw_close_fds(&r);
		err = sw_status_errno(&r);
	}
	if (!err)
		store_ext(q, &r);
	sid->has_req = 0; /* answered, either way */
	if (err) {
		pthread_mutex_lock(&cm_mu);
		sid->connecting = 0;
		pthread_mutex_unlock(&cm_mu);
		return fail(err);
	}
	atomic_store(&q->inited, 1);
	atomic_store(&q->post_ok, 1);
	return sid->sync ? sync_wait(sid, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

SW_EXPORT int rdma_reject(struct rdma_cm_id *id, const void *pdata, uint8_t len)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (!sid->has_req)
		return fail(EINVAL);
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, sid->req);
	sw_enc_bytes(&e, pdata, pdata ? len : 0);
	sid->has_req = 0;
	int err = sw_call(sid->ctx->conn, SW_OP_REJECT, &e, NULL, 0, &r);
	if (!err) {
		sw_close_fds(&r);
		err = sw_status_errno(&r);
	}
	return err ? fail(err) : 0;
}

SW_EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (!sid->qp)
		return fail(EINVAL);
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, sid->qp->h);
	int err = sw_call(sid->ctx->conn, SW_OP_DISCONNECT, &e, NULL, 0, &r);
	if (!err) {
		sw_close_fds(&r);
		err = sw_status_errno(&r);
	}
	return err && err != ENODEV ? fail(err) : 0;
}

SW_EXPORT int rdma_establish(struct rdma_cm_id *id)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	/* rdma_connect already completed the iWARP connection. */
	return sid->established ? 0 : fail(EINVAL);
}

SW_EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *attr, int *mask)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (!sid->ctx)
		return fail(EINVAL);
	enum ibv_qp_state s = attr->qp_state;
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = s;
	*mask = IBV_QP_STATE;
	if (s == IBV_QPS_INIT) {
		attr->port_num = 1;
		attr->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		*mask |= IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	}
	return 0;
}

/* ---- QPs on ids ---- */

static void free_own_cqs(struct sw_cm_id *sid)
{
	if (sid->own_scq)
		ibv_destroy_cq(sid->own_scq);
	if (sid->own_rcq)
		ibv_destroy_cq(sid->own_rcq);
	if (sid->own_sch)
		ibv_destroy_comp_channel(sid->own_sch);
	if (sid->own_rch)
		ibv_destroy_comp_channel(sid->own_rch);
	sid->own_scq = sid->own_rcq = NULL;
	sid->own_sch = sid->own_rch = NULL;
}

SW_EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (is_ud(id))
		return fail(EOPNOTSUPP);
	if (!sid->ctx || sid->wild || sid->qp)
		return fail(EINVAL); /* an id on no device yet has no PD for it, as with rdma_cm */
	struct ibv_context *c = id->verbs;
	if (!pd && !(pd = id->pd ? id->pd : cm_pd(sid->ctx)))
		return -1;
	struct ibv_qp_init_attr a = *attr;
	if (!a.srq && id->srq)
		a.srq = id->srq; /* rdma_create_srq's, as librdmacm */
	if (!a.send_cq || !a.recv_cq) {
		/* As librdmacm: one CQ per queue, of its depth, each with its
		 * own completion channel and the id as its context
		 * (rdma_get_recv_comp and rdma_get_send_comp rely on both). */
		if (!a.send_cq) {
			sid->own_sch = ibv_create_comp_channel(c);
			a.send_cq = sid->own_scq = sid->own_sch ?
				ibv_create_cq(c, (int)(a.cap.max_send_wr ? a.cap.max_send_wr : 1), id, sid->own_sch, 0) : NULL;
			id->send_cq_channel = sid->own_sch;
		}
		if (!a.recv_cq) {
			sid->own_rch = ibv_create_comp_channel(c);
			a.recv_cq = sid->own_rcq = sid->own_rch ?
				ibv_create_cq(c, (int)(a.cap.max_recv_wr ? a.cap.max_recv_wr : 1), id, sid->own_rch, 0) : NULL;
			id->recv_cq_channel = sid->own_rch;
		}
		if (!a.send_cq || !a.recv_cq)
			goto fail_cq;
		id->send_cq = a.send_cq;
		id->recv_cq = a.recv_cq;
	}
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	if (!qp)
		goto fail_cq;
	struct sw_qp *q = (struct sw_qp *)qp;
	int err = sw_qp_modify_state(q, IBV_QPS_INIT);
	if (err) {
		ibv_destroy_qp(qp);
		errno = err;
		goto fail_cq;
	}
	attr->cap = a.cap;
	pthread_mutex_lock(&sid->ctx->mu);
	q->cm = sid;
	sid->qp = q;
	pthread_mutex_unlock(&sid->ctx->mu);
	id->qp = qp;
	id->pd = pd;
	return 0;
fail_cq: {
	int e = errno;
	free_own_cqs(sid);
	id->send_cq = id->recv_cq = NULL;
	id->send_cq_channel = id->recv_cq_channel = NULL;
	return fail(e);
}
}

SW_EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	if ((attr->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS)) ||
	    ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags))
		return fail(EOPNOTSUPP); /* as ibv_create_qp_ex (verbs.c) */
	struct ibv_qp_init_attr a = {
		.qp_context = attr->qp_context, .send_cq = attr->send_cq, .recv_cq = attr->recv_cq, .srq = attr->srq,
		.cap = attr->cap, .qp_type = attr->qp_type, .sq_sig_all = attr->sq_sig_all,
	};
	int ret = rdma_create_qp(id, (attr->comp_mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : NULL, &a);
	if (!ret)
		attr->cap = a.cap;
	return ret;
}

SW_EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (id->qp)
		ibv_destroy_qp(id->qp);
	id->qp = NULL;
	sid->qp = NULL;
	free_own_cqs(sid);
}

/* From the context's reader thread, with the context's mu held. type 0:
 * the QP is being destroyed. pdata is the peer's accept private data of an
 * ESTABLISHED on the connecting side, as librdmacm reports it. */
void sw_cm_qp_event(struct sw_context *ctx, struct sw_qp *qp, uint32_t type, int status, const void *pdata,
		    size_t pdlen)
{
	(void)ctx;
	(void)status;
	struct sw_cm_id *sid = qp->cm;
	if (!sid)
		return;
	if (type == 0) {
		sid->qp = NULL;
		if (sid->id.qp == &qp->qp)
			sid->id.qp = NULL;
		qp->cm = NULL;
		/* Destroying the QP of a connection ends the connection (the
		 * daemon closes it), and the connection's events rode on the
		 * QP: the id gets its DISCONNECTED now, as rdma_cm's comes from
		 * the connection, not the QP (cmtime destroys the QP right
		 * after rdma_disconnect and waits for the event). */
		pthread_mutex_lock(&cm_mu);
		int send = sid->established && !sid->disconnected && !sid->destroyed;
		if (send)
			sid->disconnected = 1;
		pthread_mutex_unlock(&cm_mu);
		if (send)
			push(sid, NULL, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, 0, 0, 0);
		return;
	}
	pthread_mutex_lock(&cm_mu);
	enum rdma_cm_event_type ev = RDMA_CM_EVENT_ESTABLISHED;
	int send = 0;
	if (sid->destroyed) {
	} else if (type == SW_QPEV_ESTABLISHED && !sid->established && !sid->disconnected) {
		sid->established = 1;
		send = 1;
	} else if (type == SW_QPEV_DISCONNECTED && (sid->established || sid->connecting) && !sid->disconnected) {
		sid->disconnected = 1;
		ev = RDMA_CM_EVENT_DISCONNECTED;
		send = 1;
	}
	pthread_mutex_unlock(&cm_mu);
	if (!send)
		return;
	if (ev == RDMA_CM_EVENT_ESTABLISHED)
		push(sid, NULL, ev, 0, pdata, pdlen, 0, 0);
	else
		push(sid, NULL, ev, 0, NULL, 0, 0, 0);
}

void sw_cm_device_removed(struct sw_context *ctx)
{
	pthread_mutex_lock(&cm_mu);
	for (struct sw_cm_id *s = ids; s; s = s->next)
		if (s->ctx == ctx && !s->destroyed && !s->removal_sent) {
			s->removal_sent = 1;
			push(s, NULL, RDMA_CM_EVENT_DEVICE_REMOVAL, 0, NULL, 0, 0, 0);
		}
	pthread_mutex_unlock(&cm_mu);
}

/* ---- the rest of the API ---- */

/* rdma_set_option checks options as the kernel's rdma_cm does (ucma) for an
 * iWARP id; none changes what the RNIC does: TOS (a u8; the RNIC's TCP sends
 * without one), REUSEADDR and AFONLY (an int; its listeners always reuse
 * addresses, and IPv6 ids take IPv6 only), ACK_TIMEOUT (a u8, RC ids only:
 * the IB transport's retry timer, which iWARP leaves to TCP). Anything else
 * is ENOSYS, or EINVAL for IB path records. */
SW_EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	if (!id)
		return fail(EINVAL);
	if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH)
		return fail(EINVAL); /* no IB path records on iWARP */
	if (level != RDMA_OPTION_ID)
		return fail(ENOSYS);
	size_t want;
	switch (optname) {
	case RDMA_OPTION_ID_TOS:
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		want = sizeof(uint8_t);
		break;
	case RDMA_OPTION_ID_REUSEADDR:
	case RDMA_OPTION_ID_AFONLY:
		want = sizeof(int);
		break;
	default:
		return fail(ENOSYS);
	}
	if (optlen != want)
		return fail(EINVAL);
	if (!optval)
		return fail(EFAULT);
	if (optname == RDMA_OPTION_ID_ACK_TIMEOUT && id->qp_type != IBV_QPT_RC)
		return fail(EINVAL);
	return 0;
}

SW_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return id->route.addr.src_addr.sa_family == AF_INET6 ? id->route.addr.src_sin6.sin6_port
							       : id->route.addr.src_sin.sin_port;
}

SW_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return id->route.addr.dst_addr.sa_family == AF_INET6 ? id->route.addr.dst_sin6.sin6_port
							       : id->route.addr.dst_sin.sin_port;
}

SW_EXPORT struct ibv_context **rdma_get_devices(int *num)
{
	int n;
	struct sw_device **l = sw_devices(&n);
	struct ibv_context **out = calloc((size_t)n + 1, sizeof(*out));
	int k = 0;
	for (int i = 0; l && out && i < n; i++) {
		struct ibv_context *c = cm_ctx(l[i]);
		if (c)
			out[k++] = c;
	}
	free(l);
	if (num)
		*num = k;
	return out;
}

SW_EXPORT void rdma_free_devices(struct ibv_context **list) { free(list); }

/* copy_sa copies an address of n bytes into a new allocation. */
static struct sockaddr *copy_sa(const struct sockaddr *sa, socklen_t n)
{
	struct sockaddr *c = malloc(n);
	if (c)
		memcpy(c, sa, n);
	return c;
}

/* hint_addrinfo is rdma_getaddrinfo without a node or service: the hints'
 * own addresses, as librdmacm takes them (libfabric's verbs provider asks
 * this way with the addresses it already has). */
static int hint_addrinfo(const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)
{
	if (!hints->ai_src_len && !hints->ai_dst_len)
		return fail(EINVAL);
	struct rdma_addrinfo *r = calloc(1, sizeof(*r));
	if (!r)
		return fail(ENOMEM);
	r->ai_flags = hints->ai_flags;
	r->ai_family = hints->ai_family;
	r->ai_port_space = hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
	r->ai_qp_type = hints->ai_qp_type ? hints->ai_qp_type :
		(r->ai_port_space == RDMA_PS_UDP || r->ai_port_space == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC);
	if (hints->ai_dst_len && hints->ai_dst_addr) {
		if (!(r->ai_dst_addr = copy_sa(hints->ai_dst_addr, hints->ai_dst_len)))
			goto nomem;
		r->ai_dst_len = hints->ai_dst_len;
		if (!r->ai_family)
			r->ai_family = hints->ai_dst_addr->sa_family;
	}
	if (hints->ai_src_len && hints->ai_src_addr) {
		if (!(r->ai_src_addr = copy_sa(hints->ai_src_addr, hints->ai_src_len)))
			goto nomem;
		r->ai_src_len = hints->ai_src_len;
		if (!r->ai_family)
			r->ai_family = hints->ai_src_addr->sa_family;
	}
	*res = r;
	return 0;
nomem:
	rdma_freeaddrinfo(r);
	return fail(ENOMEM);
}

SW_EXPORT int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
			       struct rdma_addrinfo **res)
{
	if (!res || (!node && !service && !hints))
		return fail(EINVAL);
	if (!node && !service)
		return hint_addrinfo(hints, res);
	struct addrinfo h = {.ai_socktype = SOCK_STREAM}, *ai;
	if (hints) {
		if (hints->ai_flags & RAI_PASSIVE)
			h.ai_flags |= AI_PASSIVE;
		if (hints->ai_flags & RAI_NUMERICHOST)
			h.ai_flags |= AI_NUMERICHOST;
		h.ai_family = hints->ai_family;
	}
	int g = getaddrinfo(node, service, &h, &ai);
	if (g) {
		/* As librdmacm: getaddrinfo's own code (rdma_xserver prints it
		 * with gai_strerror), errno saying the address is not one. */
		if (g != EAI_SYSTEM)
			errno = EADDRNOTAVAIL;
		return g;
	}
	struct rdma_addrinfo *r = calloc(1, sizeof(*r));
	struct sockaddr *sa = malloc(ai->ai_addrlen);
	if (!r || !sa) {
		free(r);
		free(sa);
		freeaddrinfo(ai);
		return fail(ENOMEM);
	}
	memcpy(sa, ai->ai_addr, ai->ai_addrlen);
	r->ai_family = ai->ai_family;
	r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
	r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type :
		(r->ai_port_space == RDMA_PS_UDP || r->ai_port_space == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC);
	r->ai_flags = hints ? hints->ai_flags : 0;
	if (hints && (hints->ai_flags & RAI_PASSIVE)) {
		r->ai_src_addr = sa;
		r->ai_src_len = ai->ai_addrlen;
	} else {
		r->ai_dst_addr = sa;
		r->ai_dst_len = ai->ai_addrlen;
		if (hints && hints->ai_src_addr && hints->ai_src_len) {
			r->ai_src_addr = malloc(hints->ai_src_len);
			if (r->ai_src_addr) {
				memcpy(r->ai_src_addr, hints->ai_src_addr, hints->ai_src_len);
				r->ai_src_len = hints->ai_src_len;
			}
		}
	}
	freeaddrinfo(ai);
	*res = r;
	return 0;
}

SW_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *n = res->ai_next;
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = n;
	}
}

/* rdma_create_ep makes a synchronous id for res: passive, bound, with the
 * QP attributes rdma_get_request uses; active, resolved and with its QP. */
SW_EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
			     struct ibv_qp_init_attr *qp_init_attr)
{
	if (!id || !res)
		return fail(EINVAL);
	/* XRC is InfiniBand's; an iWARP device has no XRC QP, so neither end
	 * gets an endpoint (a passive one would listen for connections it
	 * could never take). */
	if (res->ai_qp_type == IBV_QPT_XRC_SEND || res->ai_qp_type == IBV_QPT_XRC_RECV)
		return fail(EOPNOTSUPP);
	struct rdma_cm_id *cid;
	if (rdma_create_id(NULL, &cid, NULL, (enum rdma_port_space)res->ai_port_space))
		return -1;
	struct sw_cm_id *sid = (struct sw_cm_id *)cid;
	int ret;
	if (qp_init_attr)
		qp_init_attr->qp_type = (enum ibv_qp_type)res->ai_qp_type; /* as librdmacm: the address's QP type */
	if (res->ai_flags & RAI_PASSIVE) {
		ret = rdma_bind_addr(cid, res->ai_src_addr);
		if (!ret && qp_init_attr) {
			/* rdma_get_request makes each connection's QP with these. */
			sid->ep_qp = malloc(sizeof(*qp_init_attr));
			if (!sid->ep_qp)
				ret = fail(ENOMEM);
			else
				*sid->ep_qp = *qp_init_attr;
			sid->ep_pd = pd;
		}
	} else {
		ret = rdma_resolve_addr(cid, res->ai_src_len ? res->ai_src_addr : NULL, res->ai_dst_addr, 2000);
		if (!ret)
			ret = rdma_resolve_route(cid, 2000);
		if (!ret && qp_init_attr)
			ret = rdma_create_qp(cid, pd, qp_init_attr);
	}
	if (ret) {
		int e = errno;
		rdma_destroy_id(cid);
		return fail(e);
	}
	*id = cid;
	return 0;
}

SW_EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (id->qp)
		rdma_destroy_qp(id);
	rdma_destroy_id(id);
}

SW_EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	struct sw_cm_id *l = (struct sw_cm_id *)listen;
	if (!l->sync || !l->listening)
		return fail(EINVAL);
	struct rdma_cm_event *ev;
	if (listen->event) {
		rdma_ack_cm_event(listen->event);
		listen->event = NULL;
	}
	for (;;) {
		if (rdma_get_cm_event(&l->ch->ch, &ev))
			return -1;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			break;
		int removed = ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL;
		rdma_ack_cm_event(ev);
		if (removed)
			return fail(ENODEV);
	}
	struct sw_cm_id *child = (struct sw_cm_id *)ev->id;
	/* The request stays in the new id's event, as librdmacm keeps it
	 * (its private data). */
	child->id.event = ev;
	/* The new id is synchronous too, with a channel of its own. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch) {
		rdma_destroy_id(&child->id);
		return -1;
	}
	child->ch = (struct sw_channel *)ch;
	child->id.channel = ch;
	child->sync = 1;
	if (l->ep_qp) {
		struct ibv_qp_init_attr a = *l->ep_qp;
		if (rdma_create_qp(&child->id, l->ep_pd, &a)) {
			int e = errno;
			rdma_reject(&child->id, NULL, 0);
			rdma_destroy_id(&child->id);
			return fail(e);
		}
	}
	*id = &child->id;
	return 0;
}

/* rdma_migrate_id moves an id to another event channel: its events still
 * queued on the old one move along (rsockets gives each accepted id a
 * channel of its own). A synchronous id (created without a channel) moved
 * to a channel becomes asynchronous, its own channel destroyed; an
 * asynchronous id moved to no channel becomes synchronous on a channel of
 * its own, as librdmacm does. */
SW_EXPORT int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (!id || !sid->ch || (sid->sync && !channel))
		return fail(EINVAL);
	int to_sync = !channel;
	if (to_sync && !(channel = rdma_create_event_channel()))
		return -1;
	struct sw_channel *from = sid->ch, *to = (struct sw_channel *)channel;
	if (from == to)
		return 0;
	int was_sync = sid->sync;
	pthread_mutex_lock(&cm_mu);
	pthread_mutex_lock(&from->mu);
	struct sw_cm_event *moved = NULL, **mt = &moved;
	int n = 0;
	for (struct sw_cm_event **pp = &from->q; *pp;) {
		struct sw_cm_event *e = *pp;
		if (e->ev.id == id) {
			*pp = e->next;
			e->next = NULL;
			*mt = e;
			mt = &e->next;
			n++;
		} else {
			pp = &e->next;
		}
	}
	from->tail = &from->q;
	while (*from->tail)
		from->tail = &(*from->tail)->next;
	/* The old channel's count drops by the events taken away (each
	 * queued event counted one; the count is at least that). */
	for (int i = 0; i < n; i++) {
		uint64_t v;
		int fl = fcntl(from->ch.fd, F_GETFL);
		fcntl(from->ch.fd, F_SETFL, fl | O_NONBLOCK);
		if (read(from->ch.fd, &v, sizeof(v)) != sizeof(v)) {
			/* a reader took the count already: it finds no event */
		}
		fcntl(from->ch.fd, F_SETFL, fl);
	}
	sid->ch = to;
	sid->id.channel = channel;
	sid->sync = to_sync;
	pthread_mutex_unlock(&from->mu);
	pthread_mutex_lock(&to->mu);
	if (moved) {
		*to->tail = moved;
		to->tail = mt;
	}
	pthread_mutex_unlock(&to->mu);
	pthread_mutex_unlock(&cm_mu);
	uint64_t one = 1;
	for (int i = 0; i < n; i++)
		if (write(to->ch.fd, &one, sizeof(one)) < 0) {
			/* cannot overflow in practice */
		}
	if (was_sync) {
		/* The id's own channel: no other id uses it. The event its
		 * last synchronous call kept goes with it, as in librdmacm. */
		if (id->event) {
			rdma_ack_cm_event(id->event);
			id->event = NULL;
		}
		rdma_destroy_event_channel(&from->ch);
	}
	return 0;
}

SW_EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	(void)event;
	/* As rdma_cm: EINVAL for an id with no connection manager state yet
	 * (not listening, no request, no connection); else nothing to learn
	 * from QP events on iWARP. */
	pthread_mutex_lock(&cm_mu);
	int any = sid->listening || sid->has_req || sid->connecting || sid->established;
	pthread_mutex_unlock(&cm_mu);
	return any ? 0 : fail(EINVAL);
}

SW_EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	(void)id;
	(void)addr;
	(void)context;
	return fail(EOPNOTSUPP);
}

SW_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *mc_join_attr, void *context)
{
	(void)id;
	(void)mc_join_attr;
	(void)context;
	return fail(EOPNOTSUPP);
}

SW_EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	(void)id;
	(void)addr;
	return fail(EOPNOTSUPP);
}

/* rdma_create_srq makes an SRQ on the id's device (with the id's PD, or
 * the one rdma_create_qp would use, when pd is NULL) and keeps it in
 * id->srq, which the id's rdma_create_qp then attaches its QP to (as
 * librdmacm does); rdma_destroy_srq destroys it. */
SW_EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct sw_cm_id *sid = (struct sw_cm_id *)id;
	if (!sid->ctx || sid->wild || id->srq)
		return fail(EINVAL);
	if (!pd)
		pd = id->pd;
	if (!pd && !(pd = id->pd ? id->pd : cm_pd(sid->ctx)))
		return -1;
	struct ibv_srq *srq = ibv_create_srq(pd, attr);
	if (!srq)
		return -1;
	id->srq = srq;
	id->pd = pd;
	return 0;
}

SW_EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	uint32_t known = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	if ((attr->comp_mask & ~known) || ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC))
		return fail(EOPNOTSUPP); /* XRC and tag-matching SRQs */
	struct ibv_srq_init_attr a = {.srq_context = attr->srq_context, .attr = attr->attr};
	int ret = rdma_create_srq(id, (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? attr->pd : NULL, &a);
	if (!ret)
		attr->attr = a.attr;
	return ret;
}

SW_EXPORT void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (id->srq && ibv_destroy_srq(id->srq) == 0)
		id->srq = NULL;
}

SW_EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id;
	(void)ece;
	return fail(EOPNOTSUPP);
}

SW_EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id;
	(void)ece;
	return fail(EOPNOTSUPP);
}

SW_EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return rdma_reject(id, private_data, private_data_len);
}
