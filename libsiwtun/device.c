/* Devices: the siwtun daemons' verbs sockets, contexts, queries and
 * asynchronous events. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "sw.h"

#undef ibv_get_device_list
#undef ibv_query_port

void sw_log(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	(void)n;
	fprintf(stderr, "libsiwtun: %s\n", buf); /* one write: lines of threads stay whole */
}

static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sw_device *dev_list; /* never freed: contexts keep pointers */
static char zero_sysfs[16384];     /* see sw_device.rc_sysfs */

static void copy_str(char *dst, size_t size, const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > size - 1)
		la = size - 1;
	if (lb > size - 1 - la)
		lb = size - 1 - la;
	memcpy(dst, a, la);
	memcpy(dst + la, b, lb);
	dst[la + lb] = 0;
}

static const char *socket_dir(void)
{
	const char *d = getenv("SIWTUN_SOCKET_DIR");
	return d && *d ? d : "/run/siwtun";
}

_Static_assert(SW_A_COUNT == 19, "Hello's u32s (abi_check.c)");

/* Hello: the device's name, firmware, GUID and limits. */
static int hello(struct sw_conn *c, struct sw_device *d)
{
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, SW_VERSION);
	int err = sw_call(c, SW_OP_HELLO, &e, NULL, 0, &r);
	if (err)
		return err;
	sw_close_fds(&r);
	if (r.st != SW_ST_OK) {
		sw_log("%s: hello: %s", d->sock, r.msg);
		return sw_status_errno(&r);
	}
	struct sw_dec dd = {r.body, r.blen, 0};
	sw_dec_u32(&dd);
	size_t n;
	sw_dec_bytes(&dd, &n); /* name */
	sw_dec_str(&dd, d->fw, sizeof(d->fw));
	d->guid = sw_dec_u64(&dd);
	for (int i = 0; i < SW_A_COUNT; i++)
		d->attr[i] = sw_dec_u32(&dd);
	return dd.err ? EPROTO : 0;
}

/* The RNIC's own addresses, from the control socket's "link" reply
 * ("addrs":["198.18.1.2/24",...]). */
static void query_addrs(struct sw_device *d)
{
	d->naddrs = 0;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(d->ctl) >= sizeof(sa.sun_path))
		return;
	strcpy(sa.sun_path, d->ctl);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	struct timeval tv = {2, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	static const char req[] = "{\"op\":\"link\"}\n";
	char buf[8192];
	size_t n = 0;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && write(fd, req, sizeof(req) - 1) == (ssize_t)sizeof(req) - 1) {
		while (n < sizeof(buf) - 1) {
			ssize_t k = read(fd, buf + n, sizeof(buf) - 1 - n);
			if (k <= 0)
				break;
			n += (size_t)k;
			if (memchr(buf, '\n', n))
				break;
		}
	}
	close(fd);
	buf[n] = 0;
	/* "netdev":"siwtun0": the GID's interface (ibv_query_gid_ex). */
	d->netdev[0] = 0;
	char *nd = strstr(buf, "\"netdev\":\"");
	if (nd) {
		nd += strlen("\"netdev\":\"");
		size_t l = strcspn(nd, "\"");
		if (l < sizeof(d->netdev)) {
			memcpy(d->netdev, nd, l);
			d->netdev[l] = 0;
		}
	}
	char *p = strstr(buf, "\"addrs\":[");
	if (!p)
		return;
	p += strlen("\"addrs\":[");
	while (*p == '"' && d->naddrs < SW_MAX_ADDRS) {
		char *q = strchr(p + 1, '"');
		if (!q)
			break;
		char a[64];
		size_t l = (size_t)(q - p - 1);
		if (l < sizeof(a)) {
			memcpy(a, p + 1, l);
			a[l] = 0;
			int prefix = -1;
			char *slash = strchr(a, '/');
			if (slash) {
				*slash = 0;
				prefix = atoi(slash + 1);
			}
			struct sockaddr_storage *ss = &d->addrs[d->naddrs];
			memset(ss, 0, sizeof(*ss));
			struct sockaddr_in *s4 = (void *)ss;
			struct sockaddr_in6 *s6 = (void *)ss;
			if (inet_pton(AF_INET, a, &s4->sin_addr) == 1) {
				s4->sin_family = AF_INET;
				d->prefix[d->naddrs++] = prefix < 0 ? 32 : prefix;
			} else if (inet_pton(AF_INET6, a, &s6->sin6_addr) == 1) {
				s6->sin6_family = AF_INET6;
				d->prefix[d->naddrs++] = prefix < 0 ? 128 : prefix;
			}
		}
		p = q + 1;
		if (*p == ',')
			p++;
	}
}

static int probe(struct sw_device *d)
{
	struct sw_conn *c;
	int err = sw_conn_dial(d->sock, &c);
	if (err)
		return err;
	err = sw_conn_start(c);
	if (!err)
		err = hello(c, d);
	sw_conn_close(c);
	if (!err)
		query_addrs(d);
	return err;
}

/* sw_devices refreshes the list from the socket directory: every running
 * daemon's verbs socket (SIWTUN_DEV limits it to one name). */
struct sw_device **sw_devices(int *num)
{
	static int warned;
	const char *dir = socket_dir();
	const char *only = getenv("SIWTUN_DEV");
	struct sw_device **out = calloc(64 + 1, sizeof(*out));
	int n = 0;
	char why[600] = ""; /* the first socket that did not answer, and why */
	if (!out) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&dev_mu);
	DIR *dd = opendir(dir);
	struct dirent *de;
	while (dd && (de = readdir(dd)) && n < 64) {
		size_t l = strlen(de->d_name);
		if (l <= 5 || strcmp(de->d_name + l - 5, ".sock") || l - 5 >= IBV_SYSFS_NAME_MAX)
			continue;
		char name[IBV_SYSFS_NAME_MAX];
		memcpy(name, de->d_name, l - 5);
		name[l - 5] = 0;
		if (only && *only && strcmp(only, name))
			continue;
		char path[512];
		struct stat st;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (stat(path, &st) < 0 || !S_ISSOCK(st.st_mode))
			continue;
		struct sw_device *d;
		for (d = dev_list; d; d = d->next)
			if (!strcmp(d->dev.name, name) && !strcmp(d->sock, path))
				break;
		int fresh = !d;
		if (fresh) {
			d = calloc(1, sizeof(*d));
			if (!d)
				break;
			copy_str(d->dev.name, sizeof(d->dev.name), name, "");
			copy_str(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs-", name);
			copy_str(d->dev.dev_path, sizeof(d->dev.dev_path), path, "");
			copy_str(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), dir, "");
			d->dev.node_type = IBV_NODE_RNIC;
			d->dev.transport_type = IBV_TRANSPORT_IWARP;
			d->rc_sysfs = zero_sysfs;
			snprintf(d->sock, sizeof(d->sock), "%s", path);
			snprintf(d->ctl, sizeof(d->ctl), "%s/%s.ctl", dir, name);
		}
		int perr = probe(d);
		if (perr) {
			if (!why[0] && perr != ECONNREFUSED)
				snprintf(why, sizeof(why), "%s: %s", path, strerror(perr));
			if (fresh)
				free(d);
			continue; /* a stale socket (no daemon behind it), or not ours to use */
		}
		if (fresh) {
			d->next = dev_list;
			dev_list = d;
		}
		out[n++] = d;
	}
	if (dd)
		closedir(dd);
	pthread_mutex_unlock(&dev_mu);
	if (n == 0 && !warned) {
		warned = 1;
		if (why[0])
			sw_log("no siwtun device: %s", why);
		else if (only && *only)
			sw_log("no siwtun device %s: no running daemon's verbs socket %s/%s.sock (siwtun up --dev %s; SIWTUN_SOCKET_DIR)",
			       only, dir, only, only);
		else
			sw_log("no siwtun device: no running daemon's verbs socket in %s (start one with siwtun up; SIWTUN_SOCKET_DIR overrides the directory)",
			       dir);
	}
	if (num)
		*num = n;
	return out;
}

struct sw_device *sw_device_by_name(const char *name)
{
	int n;
	struct sw_device **l = sw_devices(&n), *d = NULL;
	for (int i = 0; l && i < n; i++)
		if (!strcmp(l[i]->dev.name, name))
			d = l[i];
	free(l);
	return d;
}

SW_EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	return (struct ibv_device **)sw_devices(num);
}

SW_EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }

SW_EXPORT const char *ibv_get_device_name(struct ibv_device *dev) { return dev->name; }

SW_EXPORT __be64 ibv_get_device_guid(struct ibv_device *dev)
{
	return htobe64(((struct sw_device *)dev)->guid);
}

SW_EXPORT int ibv_get_device_index(struct ibv_device *dev)
{
	(void)dev;
	return -1; /* no kernel index */
}

/* ---- async events ---- */

void sw_async_push(struct sw_context *ctx, enum ibv_event_type type, void *obj)
{
	struct sw_async_ev *e = calloc(1, sizeof(*e));
	if (!e)
		return;
	e->ev.event_type = type;
	switch (type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
		e->ev.element.qp = obj;
		break;
	case IBV_EVENT_CQ_ERR:
		e->ev.element.cq = obj;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		e->ev.element.srq = obj;
		break;
	default:
		e->ev.element.port_num = 1;
	}
	pthread_mutex_lock(&ctx->mu);
	*ctx->aq_tail = e;
	ctx->aq_tail = &e->next;
	pthread_mutex_unlock(&ctx->mu);
	uint64_t one = 1;
	if (write(ctx->vctx.context.async_fd, &one, sizeof(one)) < 0) {
		/* the counter cannot overflow in practice */
	}
}

SW_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	struct sw_context *ctx = to_ctx(context);
	uint64_t v;
	if (read(context->async_fd, &v, sizeof(v)) != sizeof(v))
		return -1;
	pthread_mutex_lock(&ctx->mu);
	struct sw_async_ev *e = ctx->aq;
	if (e) {
		ctx->aq = e->next;
		if (!ctx->aq)
			ctx->aq_tail = &ctx->aq;
	}
	pthread_mutex_unlock(&ctx->mu);
	if (!e) {
		errno = EAGAIN;
		return -1;
	}
	*event = e->ev;
	free(e);
	return 0;
}

SW_EXPORT void ibv_ack_async_event(struct ibv_async_event *event) { (void)event; }

/* ---- events from the daemon (reader thread) ---- */

static void on_event(struct sw_conn *c, const uint8_t *body, size_t n)
{
	struct sw_context *ctx = c->owner;
	struct sw_dec d = {body, n, 0};
	uint32_t kind = sw_dec_u32(&d);
	if (kind == SW_EV_DEVICE_REMOVED) {
		size_t l;
		const uint8_t *r = sw_dec_bytes(&d, &l);
		if (r && l) {
			pthread_mutex_lock(&c->mu);
			if (l >= sizeof(c->reason))
				l = sizeof(c->reason) - 1;
			memcpy(c->reason, r, l);
			c->reason[l] = 0;
			pthread_mutex_unlock(&c->mu);
		}
		return;
	}
	if (kind == SW_EV_SRQ) {
		uint32_t h = sw_dec_u32(&d), type = sw_dec_u32(&d);
		if (!d.err)
			sw_srq_event(ctx, h, type);
		return;
	}
	if (kind != SW_EV_QP)
		return;
	uint32_t h = sw_dec_u32(&d), type = sw_dec_u32(&d);
	uint16_t code = sw_dec_u16(&d);
	(void)code;
	size_t errlen, pdlen;
	(void)sw_dec_bytes(&d, &errlen); /* the event's error text */
	/* The listener's accept private data, in the connecting side's
	 * ESTABLISHED (protocol version 2). */
	const uint8_t *pdata = sw_dec_bytes(&d, &pdlen);
	/* The extensions the connection negotiated (version 3): the event
	 * may come before the Connect's reply, and posts check them. */
	uint8_t ext = sw_dec_u8(&d);
	if (d.err)
		return;
	pthread_mutex_lock(&ctx->mu);
	struct sw_qp *qp = ctx->qps;
	while (qp && qp->h != h)
		qp = qp->next;
	if (qp) {
		switch (type) {
		case SW_QPEV_ESTABLISHED:
			atomic_store(&qp->ext, ext);
			atomic_store(&qp->inited, 1);
			atomic_store(&qp->post_ok, 1);
			qp->qp.state = IBV_QPS_RTS;
			break;
		case SW_QPEV_DISCONNECTED:
			atomic_store(&qp->post_ok, 1);
			qp->qp.state = IBV_QPS_ERR;
			break;
		case SW_QPEV_TERMINATE_SENT:
		case SW_QPEV_TERMINATE_RECEIVED:
			qp->qp.state = IBV_QPS_ERR;
			break;
		}
		sw_cm_qp_event(ctx, qp, type, 0, pdata, pdlen);
	}
	pthread_mutex_unlock(&ctx->mu);
	if (qp && (type == SW_QPEV_TERMINATE_SENT || type == SW_QPEV_TERMINATE_RECEIVED))
		sw_async_push(ctx, IBV_EVENT_QP_FATAL, &qp->qp);
}

static void on_gone(struct sw_conn *c)
{
	struct sw_context *ctx = c->owner;
	pthread_mutex_lock(&ctx->mu);
	atomic_store(&ctx->removed, 1);
	uint64_t one = 1;
	for (struct sw_cq *cq = ctx->cqs; cq; cq = cq->next)
		if (write(cq->nfd, &one, sizeof(one)) < 0) {
			/* saturated: the waiter wakes anyway */
		}
	pthread_mutex_unlock(&ctx->mu);
	sw_log("device %s removed: %s", ctx->dev->dev.name, c->reason);
	sw_async_push(ctx, IBV_EVENT_DEVICE_FATAL, NULL);
	sw_cm_device_removed(ctx);
}

/* ---- context ---- */

int sw_ctx_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int sw_ctx_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int sw_ctx_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int sw_ctx_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
struct ibv_qp *sw_ctx_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *a);
static int sw_query_port_ex(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr, size_t len);
static int sw_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			      struct ibv_device_attr_ex *attr, size_t attr_size);

SW_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct sw_device *d = NULL;
	pthread_mutex_lock(&dev_mu);
	for (struct sw_device *x = dev_list; x; x = x->next)
		if (&x->dev == device)
			d = x;
	pthread_mutex_unlock(&dev_mu);
	if (!d) {
		errno = ENODEV;
		return NULL;
	}
	struct sw_context *ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		errno = ENOMEM;
		return NULL;
	}
	int err = sw_conn_dial(d->sock, &ctx->conn);
	if (err) {
		free(ctx);
		errno = err;
		return NULL;
	}
	ctx->dev = d;
	ctx->aq_tail = &ctx->aq;
	pthread_mutex_init(&ctx->mu, NULL);
	ctx->conn->owner = ctx;
	ctx->conn->on_event = on_event;
	ctx->conn->on_gone = on_gone;
	struct ibv_context *c = &ctx->vctx.context;
	c->async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	err = c->async_fd < 0 ? errno : sw_conn_start(ctx->conn);
	if (!err)
		err = hello(ctx->conn, d);
	if (err) {
		if (c->async_fd >= 0)
			close(c->async_fd);
		sw_conn_close(ctx->conn);
		free(ctx);
		errno = err;
		return NULL;
	}
	ctx->vctx.sz = sizeof(struct verbs_context);
	ctx->vctx.query_port = sw_query_port_ex;
	ctx->vctx.query_device_ex = sw_query_device_ex;
	ctx->vctx.create_qp_ex = sw_ctx_create_qp_ex;
	ctx->vctx.priv = (struct verbs_ex_private *)ctx->rc_priv;
	c->device = device;
	c->cmd_fd = ctx->conn->fd;
	c->num_comp_vectors = 1;
	pthread_mutex_init(&c->mutex, NULL);
	c->abi_compat = __VERBS_ABI_IS_EXTENDED;
	c->ops.poll_cq = sw_ctx_poll_cq;
	c->ops.req_notify_cq = sw_ctx_req_notify_cq;
	c->ops.post_send = sw_ctx_post_send;
	c->ops.post_recv = sw_ctx_post_recv;
	c->ops.post_srq_recv = sw_ctx_post_srq_recv;
	c->ops.alloc_mw = sw_ctx_alloc_mw;
	c->ops.bind_mw = sw_ctx_bind_mw;
	c->ops.dealloc_mw = sw_ctx_dealloc_mw;
	return c;
}

SW_EXPORT int ibv_close_device(struct ibv_context *context)
{
	struct sw_context *ctx = to_ctx(context);
	sw_conn_close(ctx->conn); /* the daemon destroys what is left */
	close(context->async_fd);
	while (ctx->aq) {
		struct sw_async_ev *e = ctx->aq;
		ctx->aq = e->next;
		free(e);
	}
	pthread_mutex_destroy(&ctx->mu);
	free(ctx);
	return 0;
}

SW_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a)
{
	struct sw_device *d = to_ctx(context)->dev;
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "%s", d->fw);
	a->node_guid = htobe64(d->guid);
	a->sys_image_guid = htobe64(d->guid);
	a->max_mr_size = 1ull << 40;
	a->page_size_cap = (uint64_t)sysconf(_SC_PAGESIZE);
	a->vendor_id = d->attr[SW_A_VENDOR];
	a->vendor_part_id = d->attr[SW_A_PART];
	a->max_qp = (int)d->attr[SW_A_MAX_QP];
	a->max_qp_wr = (int)d->attr[SW_A_MAX_QP_WR];
	a->max_sge = (int)d->attr[SW_A_MAX_SGE];
	a->max_sge_rd = (int)d->attr[SW_A_MAX_SGE_RD];
	a->max_cq = (int)d->attr[SW_A_MAX_CQ];
	a->max_cqe = (int)d->attr[SW_A_MAX_CQE];
	a->max_mr = (int)d->attr[SW_A_MAX_MR];
	a->max_pd = (int)d->attr[SW_A_MAX_PD];
	a->max_qp_rd_atom = (int)d->attr[SW_A_MAX_QP_RD_ATOM];
	a->max_qp_init_rd_atom = (int)d->attr[SW_A_MAX_QP_INIT_RD_ATOM];
	a->max_res_rd_atom = a->max_qp * a->max_qp_rd_atom;
	a->max_srq = (int)d->attr[SW_A_MAX_SRQ];
	a->max_srq_wr = (int)d->attr[SW_A_MAX_SRQ_WR];
	a->max_srq_sge = (int)d->attr[SW_A_MAX_SRQ_SGE];
	a->device_cap_flags |= IBV_DEVICE_SRQ_RESIZE; /* ibv_modify_srq's IBV_SRQ_MAX_WR */
	/* Memory windows: type 1 (ibv_bind_mw) and type 2B (IBV_WR_BIND_MW,
	 * tied to the binding QP); they share the region table with the
	 * memory regions. */
	a->max_mw = (int)d->attr[SW_A_MAX_MW];
	if (a->max_mw > 0)
		a->device_cap_flags |= IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
	/* IBV_ATOMIC_HCA when the daemon does RFC 7306 atomics (toward peers
	 * that announce them), IBV_ATOMIC_NONE with its extensions off. */
	a->atomic_cap = d->attr[SW_A_ATOMIC_CAP] == IBV_ATOMIC_HCA ? IBV_ATOMIC_HCA : IBV_ATOMIC_NONE;
	a->max_pkeys = 1;
	a->phys_port_cnt = 1;
	return 0;
}

static enum ibv_mtu mtu_enum(int mtu)
{
	/* As the kernel's ib_mtu_int_to_enum. */
	if (mtu >= 4096)
		return IBV_MTU_4096;
	if (mtu >= 2048)
		return IBV_MTU_2048;
	if (mtu >= 1024)
		return IBV_MTU_1024;
	if (mtu >= 512)
		return IBV_MTU_512;
	return IBV_MTU_256;
}

/* verbs_context.query_device_ex: ibv_query_device's attributes and the
 * extended ones an iWARP RNIC has (none of the RoCE/IB offloads). Without
 * it libibverbs falls back to ibv_query_device and leaves the extended
 * fields zero (phys_port_cnt_ex 0 where phys_port_cnt is 1). */
static int sw_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			      struct ibv_device_attr_ex *attr, size_t attr_size)
{
	if (input && input->comp_mask)
		return EINVAL;
	if (attr_size < sizeof(attr->orig_attr))
		return EINVAL;
	struct ibv_device_attr_ex a;
	memset(&a, 0, sizeof(a));
	ibv_query_device(context, &a.orig_attr);
	a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
	memcpy(attr, &a, attr_size < sizeof(a) ? attr_size : sizeof(a));
	return 0;
}

static int sw_query_port_ex(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr, size_t len)
{
	struct sw_device *d = to_ctx(context)->dev;
	if (port_num != 1)
		return EINVAL;
	struct ibv_port_attr a;
	memset(&a, 0, sizeof(a));
	a.state = IBV_PORT_ACTIVE;
	a.max_mtu = a.active_mtu = mtu_enum((int)d->attr[SW_A_MTU]);
	a.gid_tbl_len = 1;
	a.max_msg_sz = 1u << 31;
	a.pkey_tbl_len = 1;
	a.active_width = 1; /* 1X */
	a.active_speed = 1; /* 2.5 Gbps: a software RNIC has no line rate */
	a.phys_state = 5;   /* LinkUp */
	a.link_layer = IBV_LINK_LAYER_ETHERNET;
	memcpy(attr, &a, len < sizeof(a) ? len : sizeof(a));
	return 0;
}

SW_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *attr)
{
	/* The old layout: every field up to link_layer. */
	int err = sw_query_port_ex(context, port_num, (struct ibv_port_attr *)attr, offsetof(struct ibv_port_attr, flags));
	if (err) {
		errno = err;
		return err;
	}
	return 0;
}

void sw_device_mac(const struct sw_device *d, uint8_t mac[6])
{
	/* The daemon's node GUID is the modified EUI-64 of the device's MAC
	 * (verbs.NodeMAC: ff:fe in the middle, the universal/local bit
	 * flipped), as siw's is of its interface's: undo it. */
	uint64_t g = d->guid;
	mac[0] = (uint8_t)(g >> 56) ^ 0x02;
	mac[1] = (uint8_t)(g >> 48);
	mac[2] = (uint8_t)(g >> 40);
	mac[3] = (uint8_t)(g >> 16);
	mac[4] = (uint8_t)(g >> 8);
	mac[5] = (uint8_t)g;
}

static int gid_of(struct sw_device *d, int index, union ibv_gid *gid)
{
	memset(gid, 0, sizeof(*gid));
	if (index != 0)
		return EINVAL;
	/* An iWARP device's GID, as Linux siw, cxgb4 and irdma build it: the
	 * interface's MAC address, the rest zero (programs and rdma-core's
	 * tests tell iWARP from RoCE by it; iWARP addresses peers by IP). */
	sw_device_mac(d, gid->raw);
	return 0;
}

SW_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	if (port_num != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	return gid_of(to_ctx(context)->dev, index, gid);
}

SW_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
				struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct sw_device *d = to_ctx(context)->dev;
	if (flags || port_num != 1 || gid_index != 0 || entry_size < sizeof(*entry))
		return EINVAL;
	memset(entry, 0, sizeof(*entry));
	gid_of(d, 0, &entry->gid);
	entry->gid_index = 0;
	entry->port_num = 1;
	entry->gid_type = IBV_GID_TYPE_IB;
	entry->ndev_ifindex = if_nametoindex(d->netdev[0] ? d->netdev : d->dev.name);
	return 0;
}

SW_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries, size_t max_entries,
				       uint32_t flags, size_t entry_size)
{
	if (max_entries < 1)
		return -EINVAL;
	int err = _ibv_query_gid_ex(context, 1, 0, entries, flags, entry_size);
	return err ? -err : 1;
}

SW_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	(void)context;
	if (port_num != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff);
	return 0;
}

SW_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	(void)context;
	return port_num == 1 && pkey == htobe16(0xffff) ? 0 : -1;
}
