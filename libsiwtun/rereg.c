/* ibv_rereg_mr: a region changed in place, keeping its keys (the daemon's
 * ReregMR; verbs/rereg.go is the Go API). */
#define _GNU_SOURCE
#include <errno.h>

#include "sw.h"

SW_EXPORT int ibv_rereg_mr(struct ibv_mr *ibmr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access)
{
	struct sw_mr *mr = (struct sw_mr *)ibmr;
	if (!flags || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED)) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	struct ibv_pd *npd = ibmr->pd;
	void *naddr = ibmr->addr;
	size_t nlen = ibmr->length;
	uint64_t niova = mr->iova;
	unsigned int nacc = mr->access;
	if (flags & IBV_REREG_MR_CHANGE_PD) {
		if (!pd || pd->context != ibmr->context) {
			errno = EINVAL;
			return IBV_REREG_MR_ERR_INPUT;
		}
		npd = pd;
	}
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		if (!addr || !length) {
			errno = EINVAL;
			return IBV_REREG_MR_ERR_INPUT;
		}
		naddr = addr;
		nlen = length;
		niova = (uintptr_t)addr;
	}
	if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
		int a = sw_mr_access((unsigned int)access);
		if (a < 0)
			return IBV_REREG_MR_ERR_INPUT;
		nacc = (unsigned int)a;
	}
	/* The new range is made memory the daemon can map (as ibv_reg_mr
	 * does); the current one already is. */
	int fd;
	int err = sw_mem_share(naddr, nlen, &fd);
	if (err) {
		errno = err;
		return IBV_REREG_MR_ERR_DONT_FORK_NEW;
	}
	struct sw_enc e;
	struct sw_reply r;
	sw_enc_begin(&e, 0, 0);
	sw_enc_u32(&e, mr->h);
	sw_enc_u32(&e, ((struct sw_pd *)npd)->h);
	sw_enc_u64(&e, (uint64_t)(uintptr_t)naddr); /* the file offset is the address */
	sw_enc_u64(&e, nlen);
	sw_enc_u64(&e, niova);
	sw_enc_u32(&e, nacc);
	err = sw_call(to_ctx(ibmr->context)->conn, SW_OP_REREG_MR, &e, &fd, 1, &r);
	if (!err) {
		sw_close_fds(&r);
		err = sw_status_errno(&r);
	}
	if (err) {
		errno = err;
		return IBV_REREG_MR_ERR_CMD; /* the region is unchanged */
	}
	ibmr->pd = npd;
	ibmr->addr = naddr;
	ibmr->length = nlen;
	mr->iova = niova;
	mr->access = nacc;
	return 0;
}
