// Package rnic assembles an RNIC in the application's process: a TCP/IP
// stack (netstack) on a link, the iWARP offload engine (offload) on that
// stack, and the verbs device (verbs) in front of the engine, the way a
// card is its Ethernet MAC, its TCP offload and its verbs provider.
//
// New builds all three; Open puts a verbs device in front of an engine
// that already exists (the daemon, `siwtun up`, serves that device on its
// verbs socket). Programs that reach a daemon through the verbs socket use
// verbs.Dial and never link this package or the engine.
package rnic

import (
	"errors"
	"fmt"

	"github.com/siwtun/siwtun/netstack"
	"github.com/siwtun/siwtun/offload"
	"github.com/siwtun/siwtun/verbs"
)

// Config is what New assembles an RNIC from.
type Config struct {
	// Stack configures the TCP/IP stack: addresses, MTU, hooks.
	Stack netstack.Options
	// Engine configures the offload engine (offload.DefaultConfig gives
	// the defaults of a device name).
	Engine offload.Config
}

// RNIC is a running in-process RNIC: the stack, the engine on it and the
// verbs device in front of the engine.
type RNIC struct {
	// Stack is the RNIC's private TCP/IP stack.
	Stack *netstack.Stack
	// Engine is the iWARP offload engine.
	Engine *offload.Device
	// Device is the verbs device applications use.
	Device *verbs.Device
}

// New builds an RNIC on link. Close releases it. It refuses a link MTU
// below offload.MinMTU.
func New(link *netstack.Link, cfg Config) (*RNIC, error) {
	s, err := netstack.New(link, cfg.Stack)
	if err != nil {
		return nil, fmt.Errorf("RNIC %s: stack: %w", cfg.Engine.Name, err)
	}
	if err := offload.CheckMTU(s.MTU(), s.Addrs()); err != nil {
		s.Close()
		return nil, fmt.Errorf("RNIC %s: %w", cfg.Engine.Name, err)
	}
	eng, err := offload.NewDevice(s, cfg.Engine)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("RNIC %s: engine: %w", cfg.Engine.Name, err)
	}
	return &RNIC{Stack: s, Engine: eng, Device: Open(eng)}, nil
}

// Close destroys the device's objects, closes every connection of the
// engine and stops the stack, in that order.
func (r *RNIC) Close() error {
	return errors.Join(r.Device.Close(), r.Engine.Close(), r.Stack.Close())
}

// Open returns a verbs device in front of an engine that runs in this
// process: verbs calls go straight to the engine.
func Open(eng *offload.Device) *verbs.Device {
	return verbs.NewDevice(&device{eng: eng, nextPD: 1})
}

// Engine returns the engine behind a device that Open or New made, or nil
// for any other device (one reached over the verbs socket).
func Engine(dev *verbs.Device) *offload.Device {
	if d, ok := dev.Provider().(*device); ok {
		return d.eng
	}
	return nil
}

// EngineQP returns the engine's queue pair behind qp, or nil if qp is not
// in-process.
func EngineQP(qp *verbs.QP) *offload.QP {
	q, _ := qp.Provider().(*offload.QP)
	return q
}

// Query returns the capabilities of an engine: what Device.Query returns
// in-process, and what the daemon reports over the verbs socket.
func Query(eng *offload.Device) verbs.DeviceAttr {
	cfg := eng.Config()
	return verbs.DeviceAttr{
		FWVersion: "0.1.0", NodeGUID: nodeGUID(cfg), VendorID: verbs.VendorID, VendorPartID: 1,
		MaxQP: cfg.MaxQP, MaxQPWR: verbs.MaxQPWR, MaxSGE: verbs.MaxSGE, MaxSGERead: verbs.MaxSGERead,
		MaxCQ: cfg.MaxQP * 2, MaxCQE: verbs.MaxCQE, MaxMR: cfg.MaxMR, MaxPD: cfg.MaxQP,
		MaxQPRdAtom: verbs.MaxIRDORD, MaxQPInitRdAtom: verbs.MaxIRDORD, MaxInline: verbs.MaxInline,
		MTU: eng.Stack().MTU(), MaxSRQ: eng.MaxSRQ(), MaxSRQWR: verbs.MaxQPWR, MaxSRQSGE: verbs.MaxSGE,
		AtomicCap: atomicCap(cfg.RDMAPExt), MaxMW: cfg.MaxMR,
	}
}

// atomicCap is the atomic capability of an engine whose RDMAP extensions
// are on (ext) or off.
func atomicCap(ext bool) verbs.AtomicCap {
	if ext {
		return verbs.AtomicHCA
	}
	return verbs.AtomicNone
}

// nodeGUID is the node GUID of a device with engine configuration cfg:
// that of its interface's MAC, or of its name's verbs.NodeMAC.
func nodeGUID(cfg offload.Config) uint64 {
	if cfg.MAC != ([6]byte{}) {
		return verbs.GUIDOfMAC(cfg.MAC)
	}
	return verbs.NodeGUID(cfg.Name)
}
