/* Compile-time checks of libsiwtun's message handling against the
 * protocol's field lists in siwtun_abi.h (generated from internal/uabi):
 * the messages libsiwtun encodes and decodes by hand (msg.c, device.c,
 * verbs.c, cma.c). A change of a message fails the build here. */
#include "siwtun_abi.h"

#define ONE(kind, name) +1
#define SZ_u8 1
#define SZ_u16 2
#define SZ_u32 4
#define SZ_u64 8
#define SZ_addr SW_ADDR_SIZE
#define SZ_bytes 2 /* the length; the bytes vary */
#define SIZE(kind, name) +SZ_##kind

/* Fixed parts, in bytes, of what libsiwtun writes and reads field by field. */
_Static_assert(0 SW_HELLO_REQUEST(SIZE) == 4 && 0 SW_HELLO_REPLY(ONE) == 23 &&
		       0 SW_HELLO_REPLY(SIZE) == 4 + 2 + 2 + 8 + 19 * 4,
	       "Hello: version, name, firmware, GUID, 19 u32s (device.c, sw.h SW_A_COUNT)");
_Static_assert(0 SW_ALLOC_PD_REPLY(SIZE) == 8, "AllocPD");
_Static_assert(0 SW_REG_MR_REQUEST(SIZE) == 4 + 8 + 8 + 8 + 4 && SW_REG_MR_REQUEST_FDS == 1 &&
		       0 SW_REG_MR_REPLY(SIZE) == 8,
	       "RegMR");
_Static_assert(0 SW_CREATE_CQ_REQUEST(SIZE) == 4 && 0 SW_CREATE_CQ_REPLY(SIZE) == 12 &&
		       SW_CREATE_CQ_REPLY_FDS == 2,
	       "CreateCQ");
_Static_assert(0 SW_CREATE_QP_REQUEST(SIZE) == 5 * 4 + 1 + 4 && 0 SW_CREATE_QP_REPLY(SIZE) == 6 * 4 &&
		       SW_CREATE_QP_REPLY_FDS == 2,
	       "CreateQP");
_Static_assert(0 SW_MODIFY_QP_REQUEST(SIZE) == 8, "ModifyQP");
_Static_assert(0 SW_QUERY_QP_REPLY(SIZE) == 4 + 2 * SW_ADDR_SIZE + 4 + 7 * 4 + 1, "QueryQP");
_Static_assert(0 SW_CONNECT_REQUEST(SIZE) == 4 + SW_ADDR_SIZE + 2 + 2 + 2, "Connect");
_Static_assert(0 SW_CONNECT_REPLY(SIZE) == 1 && 0 SW_ACCEPT_REPLY(SIZE) == 1,
	       "Connect and Accept reply Established: the extensions (cma.c)");
_Static_assert(0 SW_LISTEN_REQUEST(SIZE) == SW_ADDR_SIZE + 4 && 0 SW_LISTEN_REPLY(SIZE) == 4 + SW_ADDR_SIZE,
	       "Listen");
_Static_assert(0 SW_GET_REQUEST_REPLY(SIZE) == 4 + SW_ADDR_SIZE + 2 + 2 + 2, "GetRequest");
_Static_assert(0 SW_ACCEPT_REQUEST(SIZE) == 4 + 4 + 2 + 2 + 2 && 0 SW_REJECT_REQUEST(SIZE) == 4 + 2,
	       "Accept, Reject");
_Static_assert(0 SW_CANCEL_REQUEST(SIZE) == 4, "Cancel");
_Static_assert(0 SW_QP_EVENT(SIZE) == 4 + 4 + 2 + 2 + 2 + 1, "QP event");
_Static_assert(0 SW_CREATE_SRQ_REQUEST(SIZE) == 3 * 4 && 0 SW_CREATE_SRQ_REPLY(SIZE) == 3 * 4 &&
		       SW_CREATE_SRQ_REPLY_FDS == 1,
	       "CreateSRQ (srq.c)");
_Static_assert(0 SW_MODIFY_SRQ_REQUEST(SIZE) == 4 * 4 && 0 SW_MODIFY_SRQ_REPLY(SIZE) == 1 + 2 * 4 &&
		       SW_MODIFY_SRQ_REPLY_FDS == 1,
	       "ModifySRQ (srq.c)");
_Static_assert(0 SW_QUERY_SRQ_REPLY(SIZE) == 3 * 4, "QuerySRQ (srq.c)");
_Static_assert(0 SW_REREG_MR_REQUEST(SIZE) == 4 + 4 + 8 + 8 + 8 + 4 && SW_REREG_MR_REQUEST_FDS == 1,
	       "ReregMR (rereg.c)");
_Static_assert(0 SW_ALLOC_MW_REQUEST(SIZE) == 2 * 4 && 0 SW_ALLOC_MW_REPLY(SIZE) == 2 * 4,
	       "AllocMW (verbs.c)");
_Static_assert(0 SW_RESERVE_PORT_REQUEST(SIZE) == SW_ADDR_SIZE &&
		       0 SW_RESERVE_PORT_REPLY(SIZE) == 4 + SW_ADDR_SIZE && 0 SW_RELEASE_PORT_REQUEST(SIZE) == 4,
	       "ReservePort, ReleasePort (cma.c)");
_Static_assert(0 SW_SRQ_EVENT(SIZE) == 2 * 4 && SW_SRQEV_LIMIT_REACHED == 5, "SRQ event (device.c)");

/* ISO C wants a translation unit to declare something. */
typedef int sw_abi_checked;
