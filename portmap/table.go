package portmap

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TablePrefix starts the name of every table this package makes; the rest
// is the RNIC's device name.
const TablePrefix = "siwtun-"

// TableName is the nftables table (family ip) of device dev.
func TableName(dev string) string { return TablePrefix + dev }

const (
	portsSet  = "ports"  // the published ports (inet_service)
	fwdOffSet = "fwdoff" // interfaces whose forwarding was off (ifname)
	// ctStatusNAT is conntrack's IPS_SRC_NAT | IPS_DST_NAT.
	ctStatusNAT = 1<<4 | 1<<5
)

// tableSpec is what a device's table translates.
type tableSpec struct {
	name            string
	shared, private netip.Addr
	// fwdOff are the interfaces whose IPv4 forwarding was off until an
	// RNIC needed it.
	fwdOff []string
}

// addTable queues the creation of the whole table on c: the caller
// flushes. It returns the set of published ports.
func addTable(c *nftables.Conn, sp tableSpec) (*nftables.Set, error) {
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: sp.name})
	ports := &nftables.Set{Table: t, Name: portsSet, KeyType: nftables.TypeInetService}
	if err := c.AddSet(ports, nil); err != nil {
		return nil, fmt.Errorf("set %s: %w", portsSet, err)
	}
	fwdOff := &nftables.Set{Table: t, Name: fwdOffSet, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian}
	elems := make([]nftables.SetElement, 0, len(sp.fwdOff))
	for _, n := range sp.fwdOff {
		elems = append(elems, nftables.SetElement{Key: ifname(n)})
	}
	if err := c.AddSet(fwdOff, elems); err != nil {
		return nil, fmt.Errorf("set %s: %w", fwdOffSet, err)
	}
	shared, private := sp.shared.AsSlice(), sp.private.AsSlice()

	// New connections to a published port of the shared address go to the
	// RNIC, from the network (prerouting) and from this host (output).
	dnat := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: shared},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: ports.Name, SetID: ports.ID},
		&expr.Immediate{Register: 1, Data: private},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
	for _, hook := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"prerouting", nftables.ChainHookPrerouting}, {"output", nftables.ChainHookOutput}} {
		ch := c.AddChain(&nftables.Chain{Name: hook.name, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: hook.hook, Priority: nftables.ChainPriorityNATDest})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: dnat})
	}

	// The RNIC's own connections leave from the shared address; the port
	// stays (it is reserved in the host's port space, so no flow of the
	// host's can clash with it): those that leave the host (postrouting)
	// and those to the host's own sockets (input), which then see the
	// shared address too.
	snat := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: private},
		&expr.Immediate{Register: 1, Data: shared},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
	for _, hook := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"postrouting", nftables.ChainHookPostrouting}, {"input", nftables.ChainHookInput}} {
		ch := c.AddChain(&nftables.Chain{Name: hook.name, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: hook.hook, Priority: nftables.ChainPriorityNATSource})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: snat})
	}

	// A packet of one of the RNIC's connections that conntrack finds out
	// of its window is INVALID: no NAT translates it, the host would take
	// it for its own and answer with a reset, which the peer takes as the
	// RNIC's (the reset's sequence number is the packet's ACK, in the
	// peer's window) and ends the connection. Such packets to the shared
	// address are dropped, unless a socket of the host's own (a listener,
	// or one of its connections, the kernel's lookup finds it) is theirs:
	// the RNIC's TCP recovers as from a lost segment.
	inv := c.AddChain(&nftables.Chain{Name: "invalid", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle})
	invalidTCP := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: shared},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitINVALID), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: inv, Exprs: append(slices.Clone(invalidTCP),
		// A socket of the host's, in any state (the transparent key is
		// read of TIME_WAIT and request sockets too; the lookup breaks
		// the rule if there is none).
		&expr.Socket{Key: expr.SocketKeyTransparent, Register: 1},
		&expr.Verdict{Kind: expr.VerdictAccept},
	)})
	c.AddRule(&nftables.Rule{Table: t, Chain: inv, Exprs: append(slices.Clone(invalidTCP),
		&expr.Verdict{Kind: expr.VerdictDrop},
	)})

	// An interface whose forwarding was off forwards NATed traffic only:
	// the RNIC's (a DNATed connection to it, or a reply to one of its
	// SNATed ones), nothing the host did not forward before.
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: fwdOff.Name, SetID: fwdOff.ID},
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ctStatusNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	return ports, nil
}

// ifname is an interface name as nftables keys it: IFNAMSIZ bytes.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// portKey is a port as a set of inet_service keys it (network order).
func portKey(p uint16) []byte { return binaryutil.BigEndian.PutUint16(p) }

// fwdOffOf returns the interfaces table t records in its fwdoff set.
func fwdOffOf(c *nftables.Conn, t *nftables.Table) ([]string, error) {
	s, err := c.GetSetByName(t, fwdOffSet)
	if err != nil {
		return nil, nil // a table without the set records nothing
	}
	elems, err := c.GetSetElements(s)
	if err != nil {
		return nil, fmt.Errorf("table %s: set %s: %w", t.Name, fwdOffSet, err)
	}
	out := make([]string, 0, len(elems))
	for _, e := range elems {
		out = append(out, strings.TrimRight(string(e.Key), "\x00"))
	}
	return out, nil
}

// siwtunTables lists the tables of family ip this package made, by name.
func siwtunTables(c *nftables.Conn) ([]*nftables.Table, error) {
	all, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	var out []*nftables.Table
	for _, t := range all {
		if strings.HasPrefix(t.Name, TablePrefix) {
			out = append(out, t)
		}
	}
	return out, nil
}

// recordedOff reports whether a siwtun table other than the one named
// except records that dev's forwarding was off before it.
func recordedOff(c *nftables.Conn, except, dev string) (bool, error) {
	ts, err := siwtunTables(c)
	if err != nil {
		return false, err
	}
	for _, t := range ts {
		if t.Name == except {
			continue
		}
		devs, err := fwdOffOf(c, t)
		if err != nil {
			return false, err
		}
		for _, d := range devs {
			if d == dev {
				return true, nil
			}
		}
	}
	return false, nil
}
