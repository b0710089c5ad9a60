/* testlib: the helpers libsiwtun's C test programs share (testlib.h). */
#define _GNU_SOURCE
#include "testlib.h"

#include <arpa/inet.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

struct ibv_context *tl_open_dev(const char *name)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	CHECK(l, "ibv_get_device_list");
	struct ibv_context *c = NULL;
	for (int i = 0; i < n; i++) {
		if (strcmp(ibv_get_device_name(l[i]), name))
			continue;
		CHECK(!c, "device %s listed twice", name);
		CHECK(l[i]->transport_type == IBV_TRANSPORT_IWARP && l[i]->node_type == IBV_NODE_RNIC, "%s type", name);
		CHECK(ibv_get_device_guid(l[i]) != 0, "guid");
		/* No kernel device, so no kernel index: -1, as rdma-core gives
		 * when the kernel reports none. */
		CHECK(ibv_get_device_index(l[i]) == -1, "device index %d", ibv_get_device_index(l[i]));
		c = ibv_open_device(l[i]);
		CHECK(c, "open %s", name);
	}
	ibv_free_device_list(l);
	CHECK(c, "device %s not listed", name);
	return c;
}

/* An iWARP device's GID is its MAC (siw's form), so the programs take the
 * address from SIWTUN_TEST_ADDRS ("siwtun0=198.18.1.2,siwtun1=198.18.2.2"),
 * which the Go tests set. */
void tl_get_addr(struct ibv_context *c, struct sockaddr_in *sin)
{
	const char *name = ibv_get_device_name(c->device), *all = getenv("SIWTUN_TEST_ADDRS");
	CHECK(all, "SIWTUN_TEST_ADDRS not set");
	size_t nl = strlen(name);
	const char *p = all;
	while (p && (strncmp(p, name, nl) || p[nl] != '='))
		p = (p = strchr(p, ',')) ? p + 1 : NULL;
	CHECK(p, "no address of %s in SIWTUN_TEST_ADDRS=%s", name, all);
	char a[64];
	snprintf(a, sizeof(a), "%s", p + nl + 1);
	a[strcspn(a, ",")] = 0;
	memset(sin, 0, sizeof(*sin));
	sin->sin_family = AF_INET;
	CHECK(inet_pton(AF_INET, a, &sin->sin_addr) == 1, "address %s of %s", a, name);
}

struct rdma_cm_event *tl_wait_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	CHECK(poll(&p, 1, 10000) == 1, "no rdma_cm event (want %s)", rdma_event_str(want));
	struct rdma_cm_event *ev;
	CHECK(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
	CHECK(ev->event == want, "event %s, want %s (status %d)", rdma_event_str(ev->event), rdma_event_str(want),
	      ev->status);
	return ev;
}

void tl_ack_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	CHECK(rdma_ack_cm_event(tl_wait_event(ch, want)) == 0, "ack %s", rdma_event_str(want));
}

struct rdma_cm_id *tl_listen(struct rdma_event_channel *ch, const struct sockaddr_in *addr, int backlog)
{
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create listen id");
	CHECK(rdma_bind_addr(id, (struct sockaddr *)addr) == 0, "bind");
	CHECK(rdma_listen(id, backlog) == 0, "listen");
	return id;
}

void tl_resolve(struct rdma_cm_id *id, const struct sockaddr_in *src, const struct sockaddr_in *dst)
{
	CHECK(rdma_resolve_addr(id, (struct sockaddr *)src, (struct sockaddr *)dst, 2000) == 0, "resolve addr");
	tl_ack_event(id->channel, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(rdma_resolve_route(id, 2000) == 0, "resolve route");
	tl_ack_event(id->channel, RDMA_CM_EVENT_ROUTE_RESOLVED);
}

struct rdma_cm_id *tl_request(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev = tl_wait_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *id = ev->id;
	CHECK(rdma_ack_cm_event(ev) == 0, "ack the connect request");
	return id;
}

void tl_established(struct rdma_event_channel *a, struct rdma_event_channel *b)
{
	tl_ack_event(a, RDMA_CM_EVENT_ESTABLISHED);
	tl_ack_event(b, RDMA_CM_EVENT_ESTABLISHED);
}

void tl_disconnected(struct rdma_event_channel *a, struct rdma_event_channel *b)
{
	tl_ack_event(a, RDMA_CM_EVENT_DISCONNECTED);
	tl_ack_event(b, RDMA_CM_EVENT_DISCONNECTED);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void tl_poll_n(struct ibv_cq *cq, int n, struct ibv_wc *out)
{
	double t0 = now();
	for (int k = 0, spins = 0; k < n; spins++) {
		int got = ibv_poll_cq(cq, n - k, out + k);
		CHECK(got >= 0, "poll cq");
		k += got;
		if (got || spins < 1000)
			continue;
		/* Spin first (a completion is often microseconds away), then
		 * leave the CPU to the daemons. */
		CHECK(now() - t0 < 20, "%d of %d completions in 20 s", k, n);
		usleep(10);
	}
}

struct ibv_wc tl_poll(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	tl_poll_n(cq, 1, &wc);
	return wc;
}

void tl_want(struct ibv_wc wc, uint64_t id, enum ibv_wc_opcode op, enum ibv_wc_status st)
{
	CHECK(wc.status == st && wc.opcode == op && wc.wr_id == id, "completion status %s opcode %d id %lu, want %s %d %lu",
	      ibv_wc_status_str(wc.status), wc.opcode, (unsigned long)wc.wr_id, ibv_wc_status_str(st), op, (unsigned long)id);
}

void tl_expect(struct ibv_cq *cq, enum ibv_wc_opcode op, enum ibv_wc_status st, uint64_t id, struct ibv_wc *out)
{
	struct ibv_wc wc = tl_poll(cq);
	tl_want(wc, id, op, st);
	if (out)
		*out = wc;
}
