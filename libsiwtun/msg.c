/* Encoding and decoding of verbs socket messages (uabi/wire.go). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <string.h>

#include "sw.h"

static void put(struct sw_enc *e, const void *p, size_t n)
{
	if (e->err || e->n + n > sizeof(e->b)) {
		e->err = 1;
		return;
	}
	memcpy(e->b + e->n, p, n);
	e->n += n;
}

static void le16(uint8_t *b, uint16_t v)
{
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
}

static void le32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

void sw_enc_begin(struct sw_enc *e, uint16_t op, uint32_t seq)
{
	memset(e->b, 0, SW_MSG_HEADER_LEN);
	le16(e->b + 4, op);
	le32(e->b + 8, seq);
	e->n = SW_MSG_HEADER_LEN;
	e->err = 0;
}

void sw_enc_u8(struct sw_enc *e, uint8_t v) { put(e, &v, 1); }

void sw_enc_u16(struct sw_enc *e, uint16_t v)
{
	uint8_t b[2];
	le16(b, v);
	put(e, b, 2);
}

void sw_enc_u32(struct sw_enc *e, uint32_t v)
{
	uint8_t b[4];
	le32(b, v);
	put(e, b, 4);
}

void sw_enc_u64(struct sw_enc *e, uint64_t v)
{
	sw_enc_u32(e, (uint32_t)v);
	sw_enc_u32(e, (uint32_t)(v >> 32));
}

void sw_enc_bytes(struct sw_enc *e, const void *p, size_t n)
{
	if (n > 1024)
		n = 1024;
	sw_enc_u16(e, (uint16_t)n);
	if (n)
		put(e, p, n);
}

void sw_enc_addr(struct sw_enc *e, const struct sockaddr *sa)
{
	uint8_t a[16] = {0};
	uint8_t flag = 0;
	uint16_t port = 0;
	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const void *)sa;
		a[10] = a[11] = 0xff;
		memcpy(a + 12, &s->sin_addr, 4);
		port = ntohs(s->sin_port);
		flag = 4;
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const void *)sa;
		memcpy(a, &s->sin6_addr, 16);
		port = ntohs(s->sin6_port);
		flag = 6;
	}
	sw_enc_u8(e, flag);
	put(e, a, 16);
	sw_enc_u16(e, port);
}

void sw_enc_finish(struct sw_enc *e, int nfds)
{
	le32(e->b, (uint32_t)e->n);
	le16(e->b + 6, (uint16_t)nfds);
}

static const uint8_t *take(struct sw_dec *d, size_t n)
{
	if (d->err || d->n < n) {
		d->err = 1;
		return NULL;
	}
	const uint8_t *p = d->p;
	d->p += n;
	d->n -= n;
	return p;
}

uint8_t sw_dec_u8(struct sw_dec *d)
{
	const uint8_t *p = take(d, 1);
	return p ? p[0] : 0;
}

uint16_t sw_dec_u16(struct sw_dec *d)
{
	const uint8_t *p = take(d, 2);
	return p ? (uint16_t)(p[0] | p[1] << 8) : 0;
}

uint32_t sw_dec_u32(struct sw_dec *d)
{
	const uint8_t *p = take(d, 4);
	return p ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24 : 0;
}

uint64_t sw_dec_u64(struct sw_dec *d)
{
	uint64_t lo = sw_dec_u32(d);
	return lo | (uint64_t)sw_dec_u32(d) << 32;
}

const uint8_t *sw_dec_bytes(struct sw_dec *d, size_t *n)
{
	*n = sw_dec_u16(d);
	const uint8_t *p = take(d, *n);
	if (!p)
		*n = 0;
	return p;
}

void sw_dec_str(struct sw_dec *d, char *dst, size_t size)
{
	size_t n;
	const uint8_t *p = sw_dec_bytes(d, &n);
	if (n >= size)
		n = size - 1;
	if (p)
		memcpy(dst, p, n);
	dst[n] = 0;
}

void sw_dec_addr(struct sw_dec *d, struct sockaddr_storage *ss)
{
	uint8_t flag = sw_dec_u8(d);
	const uint8_t *a = take(d, 16);
	uint16_t port = sw_dec_u16(d);
	memset(ss, 0, sizeof(*ss));
	if (!a)
		return;
	if (flag == 4) {
		struct sockaddr_in *s = (void *)ss;
		s->sin_family = AF_INET;
		memcpy(&s->sin_addr, a + 12, 4);
		s->sin_port = htons(port);
	} else if (flag == 6) {
		struct sockaddr_in6 *s = (void *)ss;
		s->sin6_family = AF_INET6;
		memcpy(&s->sin6_addr, a, 16);
		s->sin6_port = htons(port);
	}
}
