package web

// Field names a part of a segment's payload in a byte map.
type Field uint8

// Fields of a byte map. Their names, layers and RFC sections are in Fields.
const (
	FieldUnknown     Field = iota // octets the checker could not place (undecoded, retransmitted, held)
	FieldFrameKey                 // MPA Request/Reply key "MPA ID Req Frame"
	FieldFrameFlags               // MPA frame flags (M, C, R, enhanced) and revision
	FieldFramePDLen               // MPA frame PD_Length
	FieldFrameIRDORD              // RFC 6581 IRD/ORD block
	FieldFramePD                  // MPA frame private data
	FieldMarker                   // MPA Marker (reserved + FPDUPTR)
	FieldULPDULen                 // MPA ULPDU_Length
	FieldDDPCtrl                  // DDP control (T, L, DV)
	FieldRDMAPCtrl                // RDMAP control (RV, opcode)
	FieldSTag                     // DDP tagged STag
	FieldTO                       // DDP tagged offset
	FieldQN                       // DDP untagged queue number
	FieldMSN                      // DDP untagged message sequence number
	FieldMO                       // DDP untagged message offset
	FieldReadReq                  // RDMA Read Request header
	FieldTermHdr                  // Terminate control (layer, etype, code, hdrct)
	FieldTermCopy                 // Terminate: copied DDP segment length and headers
	FieldPayload                  // ULP payload
	FieldPad                      // MPA pad
	FieldCRC                      // MPA CRC
	FieldULPDU                    // ULPDU octets whose header is not known yet
	FieldFPDU                     // FPDU octets whose ULPDU_Length is not known yet
	FieldOther                    // not iWARP (the connection does not speak MPA)
	FieldInvSTag                  // RDMAP Invalidate STag (reserved unless Send with Invalidate)
	FieldImmData                  // RFC 7306 Immediate Data of an Immediate Data message
	FieldFrameExt                 // siwtun's extension block at the end of the private data (RFC 7306 support)
	FieldAtomicReq                // RFC 7306 Atomic Request header
	FieldAtomicResp               // RFC 7306 Atomic Response header
	numFields
)

// FieldInfo describes a Field for the page: its name, the protocol layer
// it belongs to and the RFC section that defines it.
type FieldInfo struct {
	// Name is the field's name as the page shows it.
	Name string `json:"name"`
	// Layer is "mpa", "ddp", "rdmap", "ulp" or "tcp".
	Layer string `json:"layer"`
	// RFC is the rfc-editor.org address of the defining section.
	RFC string `json:"rfc"`
	// Ref is the section's short name ("RFC 5044 §4.3").
	Ref string `json:"ref"`
}

// RFC section addresses (links only: nothing is fetched).
const (
	rfcBase = "https://www.rfc-editor.org/rfc/"
	// RFCMPAFrame is the MPA Request/Reply frame format.
	RFCMPAFrame = rfcBase + "rfc5044.html#section-7.1"
	// RFCEnhancedMPA is RFC 6581's data format of enhanced MPA (the
	// IRD/ORD block, peer-to-peer mode and its RTR types).
	RFCEnhancedMPA = rfcBase + "rfc6581.html#section-9"
	// RFCFPDU is the FPDU format (ULPDU_Length, pad, CRC).
	RFCFPDU = rfcBase + "rfc5044.html#section-4.1"
	// RFCMarkers is the Marker format and placement.
	RFCMarkers = rfcBase + "rfc5044.html#section-4.3"
	// RFCCRC is the CRC calculation.
	RFCCRC = rfcBase + "rfc5044.html#section-4.4"
	// RFCMPAErrors is MPA's error semantics (LLP Terminate codes).
	RFCMPAErrors = rfcBase + "rfc5044.html#section-8"
	// RFCDDPHeader is the DDP header (control field, tagged and untagged).
	RFCDDPHeader = rfcBase + "rfc5041.html#section-4"
	// RFCDDPPlacement is DDP's data transfer and placement rules.
	RFCDDPPlacement = rfcBase + "rfc5041.html#section-5"
	// RFCDDPErrors is DDP's error codes.
	RFCDDPErrors = rfcBase + "rfc5041.html#section-7.2"
	// RFCRDMAPHeader is the RDMAP header (control field, opcodes).
	RFCRDMAPHeader = rfcBase + "rfc5040.html#section-4"
	// RFCReadRequest is the RDMA Read Request header.
	RFCReadRequest = rfcBase + "rfc5040.html#section-4.4"
	// RFCTerminate is the Terminate header.
	RFCTerminate = rfcBase + "rfc5040.html#section-4.8"
	// RFCImmediate is RFC 7306's Immediate Data.
	RFCImmediate = rfcBase + "rfc7306.html#section-6"
	// RFCAtomic is RFC 7306's atomic operations.
	RFCAtomic = rfcBase + "rfc7306.html#section-5"
	// RFCRDMAPErrors is RDMAP's error codes.
	RFCRDMAPErrors = rfcBase + "rfc5040.html#section-7.1"
	// RFCStream is RDMAP stream initialisation and teardown (the QP's life).
	RFCStream = rfcBase + "rfc5040.html#section-6"
	// RFCTCP is TCP's segment format (the segments themselves).
	RFCTCP = rfcBase + "rfc9293.html#section-3.1"
)

// Fields lists every Field's description, indexed by Field.
var Fields = [numFields]FieldInfo{
	FieldUnknown:     {"not analysed", "tcp", RFCTCP, "RFC 9293 §3.1"},
	FieldFrameKey:    {"MPA key", "mpa", RFCMPAFrame, "RFC 5044 §7.1"},
	FieldFrameFlags:  {"flags M C R, Rev", "mpa", RFCMPAFrame, "RFC 5044 §7.1"},
	FieldFramePDLen:  {"PD_Length", "mpa", RFCMPAFrame, "RFC 5044 §7.1"},
	FieldFrameIRDORD: {"IRD/ORD, P2P RTR", "mpa", RFCEnhancedMPA, "RFC 6581 §9"},
	FieldFramePD:     {"private data", "ulp", RFCMPAFrame, "RFC 5044 §7.1"},
	FieldMarker:      {"Marker (FPDUPTR)", "mpa", RFCMarkers, "RFC 5044 §4.3"},
	FieldULPDULen:    {"ULPDU_Length", "mpa", RFCFPDU, "RFC 5044 §4.1"},
	FieldDDPCtrl:     {"DDP control T L DV", "ddp", RFCDDPHeader, "RFC 5041 §4"},
	FieldRDMAPCtrl:   {"RDMAP control RV opcode", "rdmap", RFCRDMAPHeader, "RFC 5040 §4"},
	FieldSTag:        {"STag", "ddp", RFCDDPHeader, "RFC 5041 §4"},
	FieldTO:          {"Tagged Offset", "ddp", RFCDDPHeader, "RFC 5041 §4"},
	FieldQN:          {"QN", "ddp", RFCDDPHeader, "RFC 5041 §4"},
	FieldMSN:         {"MSN", "ddp", RFCDDPHeader, "RFC 5041 §4"},
	FieldMO:          {"MO", "ddp", RFCDDPHeader, "RFC 5041 §4"},
	FieldReadReq:     {"Read Request sink/source", "rdmap", RFCReadRequest, "RFC 5040 §4.4"},
	FieldTermHdr:     {"Terminate control", "rdmap", RFCTerminate, "RFC 5040 §4.8"},
	FieldTermCopy:    {"copied headers", "rdmap", RFCTerminate, "RFC 5040 §4.8"},
	FieldPayload:     {"payload", "ulp", RFCDDPPlacement, "RFC 5041 §5"},
	FieldPad:         {"pad", "mpa", RFCFPDU, "RFC 5044 §4.1"},
	FieldCRC:         {"CRC32c", "mpa", RFCCRC, "RFC 5044 §4.4"},
	FieldULPDU:       {"ULPDU (header not yet seen)", "ddp", RFCFPDU, "RFC 5044 §4.1"},
	FieldFPDU:        {"FPDU (length not yet seen)", "mpa", RFCFPDU, "RFC 5044 §4.1"},
	FieldOther:       {"not iWARP", "tcp", RFCTCP, "RFC 9293 §3.1"},
	FieldInvSTag:     {"Invalidate STag (reserved)", "rdmap", RFCRDMAPHeader, "RFC 5040 §4"},
	FieldImmData:     {"Immediate Data", "rdmap", RFCImmediate, "RFC 7306 §6"},
	FieldFrameExt:    {"siwtun extension block (RFC 7306 support)", "mpa", RFCMPAFrame, "RFC 5044 §7.1"},
	FieldAtomicReq:   {"Atomic Request", "rdmap", RFCAtomic, "RFC 7306 §5"},
	FieldAtomicResp:  {"Atomic Response", "rdmap", RFCAtomic, "RFC 7306 §5"},
}

// String returns the field's name.
func (f Field) String() string {
	if int(f) < len(Fields) {
		return Fields[f].Name
	}
	return "?"
}
