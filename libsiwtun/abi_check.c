/* Compile-time checks of libsiwtun's message handling against the
 * protocol header verbs/internal/uabi generates (CHeader, checked in as
 * testdata/siwtun_uabi.h): op numbers, statuses, and the field lists of the
 * messages libsiwtun encodes and decodes by hand (msg.c, device.c,
 * verbs.c, cma.c). A change of the protocol fails the build here. */
#include "siwtun_abi.h"
#include "siwtun_uabi.h"

#define ONE(kind, name) +1
#define SZ_u8 1
#define SZ_u16 2
#define SZ_u32 4
#define SZ_u64 8
#define SZ_addr SIWTUN_ADDR_SIZE
#define SZ_bytes 2 /* the length; the bytes vary */
#define SIZE(kind, name) +SZ_##kind

_Static_assert(SW_MSG_HEADER_LEN == SIWTUN_MSG_HEADER_LEN && SW_MAX_MSG == SIWTUN_MAX_MSG &&
		       SW_MAX_FDS == SIWTUN_MAX_FDS && SW_VERSION == SIWTUN_VERSION && SW_REPLY_BIT == SIWTUN_REPLY_BIT &&
		       SW_OP_EVENT == SIWTUN_OP_EVENT,
	       "message header");
_Static_assert(SW_OP_HELLO == SIWTUN_OP_HELLO && SW_OP_ALLOC_PD == SIWTUN_OP_ALLOC_PD &&
		       SW_OP_DEALLOC_PD == SIWTUN_OP_DEALLOC_PD && SW_OP_REG_MR == SIWTUN_OP_REG_MR &&
		       SW_OP_DEREG_MR == SIWTUN_OP_DEREG_MR && SW_OP_CREATE_CQ == SIWTUN_OP_CREATE_CQ &&
		       SW_OP_DESTROY_CQ == SIWTUN_OP_DESTROY_CQ && SW_OP_CREATE_QP == SIWTUN_OP_CREATE_QP &&
		       SW_OP_DESTROY_QP == SIWTUN_OP_DESTROY_QP && SW_OP_MODIFY_QP == SIWTUN_OP_MODIFY_QP &&
		       SW_OP_QUERY_QP == SIWTUN_OP_QUERY_QP && SW_OP_CONNECT == SIWTUN_OP_CONNECT &&
		       SW_OP_DISCONNECT == SIWTUN_OP_DISCONNECT && SW_OP_LISTEN == SIWTUN_OP_LISTEN &&
		       SW_OP_CLOSE_LISTENER == SIWTUN_OP_CLOSE_LISTENER && SW_OP_GET_REQUEST == SIWTUN_OP_GET_REQUEST &&
		       SW_OP_ACCEPT == SIWTUN_OP_ACCEPT && SW_OP_REJECT == SIWTUN_OP_REJECT && SW_OP_CANCEL == SIWTUN_OP_CANCEL &&
		       SW_OP_CREATE_SRQ == SIWTUN_OP_CREATE_SRQ && SW_OP_DESTROY_SRQ == SIWTUN_OP_DESTROY_SRQ &&
		       SW_OP_MODIFY_SRQ == SIWTUN_OP_MODIFY_SRQ && SW_OP_QUERY_SRQ == SIWTUN_OP_QUERY_SRQ &&
		       SW_OP_REREG_MR == SIWTUN_OP_REREG_MR && SW_OP_ALLOC_MW == SIWTUN_OP_ALLOC_MW &&
		       SW_OP_DEALLOC_MW == SIWTUN_OP_DEALLOC_MW && SW_OP_RESERVE_PORT == SIWTUN_OP_RESERVE_PORT &&
		       SW_OP_RELEASE_PORT == SIWTUN_OP_RELEASE_PORT,
	       "ops");
_Static_assert(SW_ST_OK == SIWTUN_ST_OK && SW_ST_ERROR == SIWTUN_ST_ERROR && SW_ST_REJECTED == SIWTUN_ST_REJECTED &&
		       SW_ST_REMOVED == SIWTUN_ST_REMOVED && SW_ST_CANCELED == SIWTUN_ST_CANCELED &&
		       SW_ST_NOT_SUPPORTED == SIWTUN_ST_NOT_SUPPORTED && SW_ST_LIMIT == SIWTUN_ST_LIMIT && SW_EV_QP == SIWTUN_EV_QP &&
		       SW_EV_DEVICE_REMOVED == SIWTUN_EV_DEVICE_REMOVED && SW_EV_SRQ == SIWTUN_EV_SRQ,
	       "statuses and events");
_Static_assert(SW_RING_HEADER_SIZE == SIWTUN_RING_HEADER_SIZE && SW_RING_MAGIC == SIWTUN_RING_MAGIC &&
		       SW_SQE_SIZE == SIWTUN_SQE_SIZE && SW_RQE_SIZE == SIWTUN_RQE_SIZE && SW_CQE_SIZE == SIWTUN_CQE_SIZE &&
		       SW_OWNER_VALID == SIWTUN_WQE_VALID && SW_NOTIFY_NEXT == SIWTUN_NOTIFY_NEXT &&
		       SW_NOTIFY_SOLICITED == SIWTUN_NOTIFY_SOLICITED,
	       "rings");
/* Fixed parts, in bytes, of what libsiwtun writes and reads field by field. */
_Static_assert(0 SIWTUN_HELLO_REQUEST(SIZE) == 4 && 0 SIWTUN_HELLO_REPLY(ONE) == 23 &&
		       0 SIWTUN_HELLO_REPLY(SIZE) == 4 + 2 + 2 + 8 + 19 * 4,
	       "Hello: version, name, firmware, GUID, 19 u32s (device.c, sw.h SW_A_COUNT)");
_Static_assert(0 SIWTUN_ALLOC_PD_REPLY(SIZE) == 8, "AllocPD");
_Static_assert(0 SIWTUN_REG_MR_REQUEST(SIZE) == 4 + 8 + 8 + 8 + 4 && SIWTUN_REG_MR_REQUEST_FDS == 1 &&
		       0 SIWTUN_REG_MR_REPLY(SIZE) == 8,
	       "RegMR");
_Static_assert(0 SIWTUN_CREATE_CQ_REQUEST(SIZE) == 4 && 0 SIWTUN_CREATE_CQ_REPLY(SIZE) == 12 &&
		       SIWTUN_CREATE_CQ_REPLY_FDS == 2,
	       "CreateCQ");
_Static_assert(0 SIWTUN_CREATE_QP_REQUEST(SIZE) == 5 * 4 + 1 + 4 && 0 SIWTUN_CREATE_QP_REPLY(SIZE) == 6 * 4 &&
		       SIWTUN_CREATE_QP_REPLY_FDS == 2,
	       "CreateQP");
_Static_assert(0 SIWTUN_MODIFY_QP_REQUEST(SIZE) == 8, "ModifyQP");
_Static_assert(0 SIWTUN_QUERY_QP_REPLY(SIZE) == 4 + 2 * SIWTUN_ADDR_SIZE + 4 + 7 * 4 + 1, "QueryQP");
_Static_assert(0 SIWTUN_CONNECT_REQUEST(SIZE) == 4 + SIWTUN_ADDR_SIZE + 2 + 2 + 2, "Connect");
_Static_assert(0 SIWTUN_CONNECT_REPLY(SIZE) == 1 && 0 SIWTUN_ACCEPT_REPLY(SIZE) == 1,
	       "Connect and Accept reply Established: the extensions (cma.c)");
_Static_assert(0 SIWTUN_LISTEN_REQUEST(SIZE) == SIWTUN_ADDR_SIZE + 4 && 0 SIWTUN_LISTEN_REPLY(SIZE) == 4 + SIWTUN_ADDR_SIZE,
	       "Listen");
_Static_assert(0 SIWTUN_GET_REQUEST_REPLY(SIZE) == 4 + SIWTUN_ADDR_SIZE + 2 + 2 + 2, "GetRequest");
_Static_assert(0 SIWTUN_ACCEPT_REQUEST(SIZE) == 4 + 4 + 2 + 2 + 2 && 0 SIWTUN_REJECT_REQUEST(SIZE) == 4 + 2,
	       "Accept, Reject");
_Static_assert(0 SIWTUN_CANCEL_REQUEST(SIZE) == 4, "Cancel");
_Static_assert(0 SIWTUN_QP_EVENT(SIZE) == 4 + 4 + 2 + 2 + 2 + 1, "QP event");
_Static_assert(0 SIWTUN_CREATE_SRQ_REQUEST(SIZE) == 3 * 4 && 0 SIWTUN_CREATE_SRQ_REPLY(SIZE) == 3 * 4 &&
		       SIWTUN_CREATE_SRQ_REPLY_FDS == 1,
	       "CreateSRQ (srq.c)");
_Static_assert(0 SIWTUN_MODIFY_SRQ_REQUEST(SIZE) == 4 * 4 && 0 SIWTUN_MODIFY_SRQ_REPLY(SIZE) == 1 + 2 * 4 &&
		       SIWTUN_MODIFY_SRQ_REPLY_FDS == 1,
	       "ModifySRQ (srq.c)");
_Static_assert(0 SIWTUN_QUERY_SRQ_REPLY(SIZE) == 3 * 4, "QuerySRQ (srq.c)");
_Static_assert(0 SIWTUN_REREG_MR_REQUEST(SIZE) == 4 + 4 + 8 + 8 + 8 + 4 && SIWTUN_REREG_MR_REQUEST_FDS == 1,
	       "ReregMR (rereg.c)");
_Static_assert(0 SIWTUN_ALLOC_MW_REQUEST(SIZE) == 2 * 4 && 0 SIWTUN_ALLOC_MW_REPLY(SIZE) == 2 * 4,
	       "AllocMW (verbs.c)");
_Static_assert(0 SIWTUN_RESERVE_PORT_REQUEST(SIZE) == SIWTUN_ADDR_SIZE &&
		       0 SIWTUN_RESERVE_PORT_REPLY(SIZE) == 4 + SIWTUN_ADDR_SIZE && 0 SIWTUN_RELEASE_PORT_REQUEST(SIZE) == 4,
	       "ReservePort, ReleasePort (cma.c)");
_Static_assert(0 SIWTUN_SRQ_EVENT(SIZE) == 2 * 4 && SW_SRQEV_LIMIT_REACHED == 5, "SRQ event (device.c)");

/* ISO C wants a translation unit to declare something. */
typedef int sw_abi_checked;
