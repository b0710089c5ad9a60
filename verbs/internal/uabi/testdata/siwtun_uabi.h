/* siwtun verbs-socket ABI, generated from verbs/internal/uabi (CHeader). Do not edit. */
#ifndef SIWTUN_UABI_H
#define SIWTUN_UABI_H

/* Messages: a little-endian header (u32 length, u16 op, u16 nfds, u32 seq), then the body.
 * A reply's body is a status (u32 code; if not OK: bytes msg, then bytes detail if present),
 * then, if OK, the op's reply fields. An event's body is a u32 kind, then its fields.
 * Kinds: u8 u16 u32 u64; bytes = u16 length + at most SIWTUN_MAX_BYTES bytes;
 * addr = u8 family (0 none, 4, 6), 16 address bytes (IPv4-mapped), u16 port. */
#define SIWTUN_MSG_HEADER_LEN 12
#define SIWTUN_MAX_MSG 4096
#define SIWTUN_MAX_FDS 2
#define SIWTUN_VERSION 7
#define SIWTUN_REPLY_BIT 0x8000
#define SIWTUN_MAX_BYTES 1024
#define SIWTUN_ADDR_SIZE 19
#define SIWTUN_OP_EVENT 0x4000
#define SIWTUN_RING_HEADER_SIZE 64
#define SIWTUN_RING_MAGIC 0x52574953
#define SIWTUN_SQE_SIZE 392
#define SIWTUN_RQE_SIZE 112
#define SIWTUN_CQE_SIZE 40
#define SIWTUN_WQE_VALID 1
#define SIWTUN_CQE_SOLICITED 2
#define SIWTUN_NOTIFY_NONE 0
#define SIWTUN_NOTIFY_NEXT 1
#define SIWTUN_NOTIFY_SOLICITED 2

/* Reply status codes. */
#define SIWTUN_ST_OK 0
#define SIWTUN_ST_ERROR 1
#define SIWTUN_ST_BAD_MESSAGE 2
#define SIWTUN_ST_UNKNOWN_OP 3
#define SIWTUN_ST_BAD_HANDLE 4
#define SIWTUN_ST_FOREIGN 5
#define SIWTUN_ST_BUSY 6
#define SIWTUN_ST_QP_STATE 7
#define SIWTUN_ST_REJECTED 8
#define SIWTUN_ST_CANCELED 9
#define SIWTUN_ST_REMOVED 10
#define SIWTUN_ST_NOT_SUPPORTED 11
#define SIWTUN_ST_LIMIT 12

/* Hello */
#define SIWTUN_OP_HELLO 1
#define SIWTUN_HELLO_REQUEST(X) \
	X(u32, version)
#define SIWTUN_HELLO_REQUEST_FDS 0
#define SIWTUN_HELLO_REPLY(X) \
	X(u32, version) \
	X(bytes, name) \
	X(bytes, fw_version) \
	X(u64, node_guid) \
	X(u32, vendor_id) \
	X(u32, vendor_part_id) \
	X(u32, max_qp) \
	X(u32, max_qpwr) \
	X(u32, max_sge) \
	X(u32, max_sge_read) \
	X(u32, max_cq) \
	X(u32, max_cqe) \
	X(u32, max_mr) \
	X(u32, max_pd) \
	X(u32, max_qp_rd_atom) \
	X(u32, max_qp_init_rd_atom) \
	X(u32, max_inline) \
	X(u32, mtu) \
	X(u32, max_srq) \
	X(u32, max_srqwr) \
	X(u32, max_srqsge) \
	X(u32, atomic_cap) \
	X(u32, max_mw)
#define SIWTUN_HELLO_REPLY_FDS 0

/* AllocPD */
#define SIWTUN_OP_ALLOC_PD 2
#define SIWTUN_ALLOC_PD_REQUEST(X)
#define SIWTUN_ALLOC_PD_REQUEST_FDS 0
#define SIWTUN_ALLOC_PD_REPLY(X) \
	X(u32, handle) \
	X(u32, pd_num)
#define SIWTUN_ALLOC_PD_REPLY_FDS 0

/* DeallocPD */
#define SIWTUN_OP_DEALLOC_PD 3
#define SIWTUN_DEALLOC_PD_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_DEALLOC_PD_REQUEST_FDS 0
#define SIWTUN_DEALLOC_PD_REPLY(X)
#define SIWTUN_DEALLOC_PD_REPLY_FDS 0

/* RegMR */
#define SIWTUN_OP_REG_MR 4
#define SIWTUN_REG_MR_REQUEST(X) \
	X(u32, pd) \
	X(u64, offset) \
	X(u64, length) \
	X(u64, iova) \
	X(u32, access)
#define SIWTUN_REG_MR_REQUEST_FDS 1
#define SIWTUN_REG_MR_REPLY(X) \
	X(u32, handle) \
	X(u32, stag)
#define SIWTUN_REG_MR_REPLY_FDS 0

/* DeregMR */
#define SIWTUN_OP_DEREG_MR 5
#define SIWTUN_DEREG_MR_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_DEREG_MR_REQUEST_FDS 0
#define SIWTUN_DEREG_MR_REPLY(X)
#define SIWTUN_DEREG_MR_REPLY_FDS 0

/* CreateCQ */
#define SIWTUN_OP_CREATE_CQ 6
#define SIWTUN_CREATE_CQ_REQUEST(X) \
	X(u32, depth)
#define SIWTUN_CREATE_CQ_REQUEST_FDS 0
#define SIWTUN_CREATE_CQ_REPLY(X) \
	X(u32, handle) \
	X(u32, count) \
	X(u32, size)
#define SIWTUN_CREATE_CQ_REPLY_FDS 2

/* DestroyCQ */
#define SIWTUN_OP_DESTROY_CQ 7
#define SIWTUN_DESTROY_CQ_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_DESTROY_CQ_REQUEST_FDS 0
#define SIWTUN_DESTROY_CQ_REPLY(X)
#define SIWTUN_DESTROY_CQ_REPLY_FDS 0

/* CreateQP */
#define SIWTUN_OP_CREATE_QP 8
#define SIWTUN_CREATE_QP_REQUEST(X) \
	X(u32, pd) \
	X(u32, send_cq) \
	X(u32, recv_cq) \
	X(u32, max_send_wr) \
	X(u32, max_recv_wr) \
	X(u8, signal_all) \
	X(u32, srq)
#define SIWTUN_CREATE_QP_REQUEST_FDS 0
#define SIWTUN_CREATE_QP_REPLY(X) \
	X(u32, handle) \
	X(u32, num) \
	X(u32, sq_count) \
	X(u32, rq_count) \
	X(u32, sq_bytes) \
	X(u32, total)
#define SIWTUN_CREATE_QP_REPLY_FDS 2

/* DestroyQP */
#define SIWTUN_OP_DESTROY_QP 9
#define SIWTUN_DESTROY_QP_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_DESTROY_QP_REQUEST_FDS 0
#define SIWTUN_DESTROY_QP_REPLY(X)
#define SIWTUN_DESTROY_QP_REPLY_FDS 0

/* ModifyQP */
#define SIWTUN_OP_MODIFY_QP 10
#define SIWTUN_MODIFY_QP_REQUEST(X) \
	X(u32, handle) \
	X(u32, state)
#define SIWTUN_MODIFY_QP_REQUEST_FDS 0
#define SIWTUN_MODIFY_QP_REPLY(X)
#define SIWTUN_MODIFY_QP_REPLY_FDS 0

/* QueryQP */
#define SIWTUN_OP_QUERY_QP 11
#define SIWTUN_QUERY_QP_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_QUERY_QP_REQUEST_FDS 0
#define SIWTUN_QUERY_QP_REPLY(X) \
	X(u32, state) \
	X(addr, local) \
	X(addr, remote) \
	X(u8, rev) \
	X(u8, crc) \
	X(u8, markers_tx) \
	X(u8, markers_rx) \
	X(u32, ird) \
	X(u32, ord) \
	X(u32, sq_depth) \
	X(u32, sq_use) \
	X(u32, rq_depth) \
	X(u32, rq_use) \
	X(u32, emss) \
	X(u8, ext)
#define SIWTUN_QUERY_QP_REPLY_FDS 0

/* Connect */
#define SIWTUN_OP_CONNECT 12
#define SIWTUN_CONNECT_REQUEST(X) \
	X(u32, handle) \
	X(addr, remote) \
	X(bytes, param_private_data) \
	X(u16, param_responder_resources) \
	X(u16, param_initiator_depth)
#define SIWTUN_CONNECT_REQUEST_FDS 0
#define SIWTUN_CONNECT_REPLY(X) \
	X(u8, ext)
#define SIWTUN_CONNECT_REPLY_FDS 0

/* Disconnect */
#define SIWTUN_OP_DISCONNECT 13
#define SIWTUN_DISCONNECT_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_DISCONNECT_REQUEST_FDS 0
#define SIWTUN_DISCONNECT_REPLY(X)
#define SIWTUN_DISCONNECT_REPLY_FDS 0

/* Listen */
#define SIWTUN_OP_LISTEN 14
#define SIWTUN_LISTEN_REQUEST(X) \
	X(addr, addr) \
	X(u32, backlog)
#define SIWTUN_LISTEN_REQUEST_FDS 0
#define SIWTUN_LISTEN_REPLY(X) \
	X(u32, handle) \
	X(addr, addr)
#define SIWTUN_LISTEN_REPLY_FDS 0

/* CloseListener */
#define SIWTUN_OP_CLOSE_LISTENER 15
#define SIWTUN_CLOSE_LISTENER_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_CLOSE_LISTENER_REQUEST_FDS 0
#define SIWTUN_CLOSE_LISTENER_REPLY(X)
#define SIWTUN_CLOSE_LISTENER_REPLY_FDS 0

/* GetRequest */
#define SIWTUN_OP_GET_REQUEST 16
#define SIWTUN_GET_REQUEST_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_GET_REQUEST_REQUEST_FDS 0
#define SIWTUN_GET_REQUEST_REPLY(X) \
	X(u32, handle) \
	X(addr, remote) \
	X(bytes, private_data) \
	X(u16, ird) \
	X(u16, ord)
#define SIWTUN_GET_REQUEST_REPLY_FDS 0

/* Accept */
#define SIWTUN_OP_ACCEPT 17
#define SIWTUN_ACCEPT_REQUEST(X) \
	X(u32, request) \
	X(u32, qp) \
	X(bytes, param_private_data) \
	X(u16, param_responder_resources) \
	X(u16, param_initiator_depth)
#define SIWTUN_ACCEPT_REQUEST_FDS 0
#define SIWTUN_ACCEPT_REPLY(X) \
	X(u8, ext)
#define SIWTUN_ACCEPT_REPLY_FDS 0

/* Reject */
#define SIWTUN_OP_REJECT 18
#define SIWTUN_REJECT_REQUEST(X) \
	X(u32, request) \
	X(bytes, private_data)
#define SIWTUN_REJECT_REQUEST_FDS 0
#define SIWTUN_REJECT_REPLY(X)
#define SIWTUN_REJECT_REPLY_FDS 0

/* Cancel */
#define SIWTUN_OP_CANCEL 19
#define SIWTUN_CANCEL_REQUEST(X) \
	X(u32, seq)
#define SIWTUN_CANCEL_REQUEST_FDS 0

/* CreateSRQ */
#define SIWTUN_OP_CREATE_SRQ 20
#define SIWTUN_CREATE_SRQ_REQUEST(X) \
	X(u32, pd) \
	X(u32, max_wr) \
	X(u32, limit)
#define SIWTUN_CREATE_SRQ_REQUEST_FDS 0
#define SIWTUN_CREATE_SRQ_REPLY(X) \
	X(u32, handle) \
	X(u32, count) \
	X(u32, size)
#define SIWTUN_CREATE_SRQ_REPLY_FDS 1

/* DestroySRQ */
#define SIWTUN_OP_DESTROY_SRQ 21
#define SIWTUN_DESTROY_SRQ_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_DESTROY_SRQ_REQUEST_FDS 0
#define SIWTUN_DESTROY_SRQ_REPLY(X)
#define SIWTUN_DESTROY_SRQ_REPLY_FDS 0

/* ModifySRQ */
#define SIWTUN_OP_MODIFY_SRQ 22
#define SIWTUN_MODIFY_SRQ_REQUEST(X) \
	X(u32, handle) \
	X(u32, mask) \
	X(u32, max_wr) \
	X(u32, limit)
#define SIWTUN_MODIFY_SRQ_REQUEST_FDS 0
#define SIWTUN_MODIFY_SRQ_REPLY(X) \
	X(u8, new) \
	X(u32, count) \
	X(u32, size)
#define SIWTUN_MODIFY_SRQ_REPLY_FDS 1

/* QuerySRQ */
#define SIWTUN_OP_QUERY_SRQ 23
#define SIWTUN_QUERY_SRQ_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_QUERY_SRQ_REQUEST_FDS 0
#define SIWTUN_QUERY_SRQ_REPLY(X) \
	X(u32, max_wr) \
	X(u32, max_sge) \
	X(u32, limit)
#define SIWTUN_QUERY_SRQ_REPLY_FDS 0

/* ReregMR */
#define SIWTUN_OP_REREG_MR 24
#define SIWTUN_REREG_MR_REQUEST(X) \
	X(u32, handle) \
	X(u32, pd) \
	X(u64, offset) \
	X(u64, length) \
	X(u64, iova) \
	X(u32, access)
#define SIWTUN_REREG_MR_REQUEST_FDS 1
#define SIWTUN_REREG_MR_REPLY(X)
#define SIWTUN_REREG_MR_REPLY_FDS 0

/* AllocMW */
#define SIWTUN_OP_ALLOC_MW 25
#define SIWTUN_ALLOC_MW_REQUEST(X) \
	X(u32, pd) \
	X(u32, type)
#define SIWTUN_ALLOC_MW_REQUEST_FDS 0
#define SIWTUN_ALLOC_MW_REPLY(X) \
	X(u32, handle) \
	X(u32, r_key)
#define SIWTUN_ALLOC_MW_REPLY_FDS 0

/* DeallocMW */
#define SIWTUN_OP_DEALLOC_MW 26
#define SIWTUN_DEALLOC_MW_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_DEALLOC_MW_REQUEST_FDS 0
#define SIWTUN_DEALLOC_MW_REPLY(X)
#define SIWTUN_DEALLOC_MW_REPLY_FDS 0

/* ReservePort */
#define SIWTUN_OP_RESERVE_PORT 27
#define SIWTUN_RESERVE_PORT_REQUEST(X) \
	X(addr, addr)
#define SIWTUN_RESERVE_PORT_REQUEST_FDS 0
#define SIWTUN_RESERVE_PORT_REPLY(X) \
	X(u32, handle) \
	X(addr, addr)
#define SIWTUN_RESERVE_PORT_REPLY_FDS 0

/* ReleasePort */
#define SIWTUN_OP_RELEASE_PORT 28
#define SIWTUN_RELEASE_PORT_REQUEST(X) \
	X(u32, handle)
#define SIWTUN_RELEASE_PORT_REQUEST_FDS 0
#define SIWTUN_RELEASE_PORT_REPLY(X)
#define SIWTUN_RELEASE_PORT_REPLY_FDS 0

/* QP event */
#define SIWTUN_EV_QP 1
#define SIWTUN_QP_EVENT(X) \
	X(u32, qp) \
	X(u32, type) \
	X(u16, code) \
	X(bytes, err) \
	X(bytes, private_data) \
	X(u8, ext)

/* DeviceRemoved event */
#define SIWTUN_EV_DEVICE_REMOVED 2
#define SIWTUN_DEVICE_REMOVED_EVENT(X) \
	X(bytes, reason)

/* SRQ event */
#define SIWTUN_EV_SRQ 3
#define SIWTUN_SRQ_EVENT(X) \
	X(u32, srq) \
	X(u32, type)

#endif /* SIWTUN_UABI_H */
