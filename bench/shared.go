package bench

import "fmt"

// Shared-address mode next to routed mode (SuiteShared): the same two
// daemons in the same namespace, once routed (each RNIC its own address,
// the host's on the TUN device, the kernel routing between the devices)
// and once each sharing an address the host has on its TUN device
// (`siwtun up --shared <addr> --shared-dev <dev>`), where the host's NAT
// carries the RNICs' ports and every connection reserves a port in the
// host's port space. What the NAT and the reservations cost shows in the
// ratios: RDMA WRITE 1 MiB bandwidth, the 4 B RDMA WRITE round trip and
// connections per second, shared over routed.

const (
	// SuiteShared measures shared-address mode next to routed mode.
	SuiteShared = "shared"
	// StackRouted is SuiteShared's daemons routed: their own addresses.
	StackRouted = "siwtun-routed"
	// StackShared is SuiteShared's daemons sharing addresses of the host's.
	StackShared = "siwtun-shared"
)

// The targets of SuiteShared: shared over routed.
const (
	// TargetSharedBW is the least RDMA WRITE 1 MiB bandwidth.
	TargetSharedBW = 0.95
	// TargetSharedLat is the most 4 B RDMA WRITE round trip.
	TargetSharedLat = 1.05
	// TargetSharedRate is the fewest connections per second.
	TargetSharedRate = 0.9
)

// measureShared takes SuiteShared's figures at mtu: with the daemons
// routed, then sharing (the order turning from round to round), RDMA
// WRITE 1 MiB bandwidth, the 4 B RDMA WRITE round trip (CRC on) and
// connections per second from one client.
func (r *runner) measureShared(mtu int) error {
	stacks := []string{StackRouted, StackShared}
	if r.round%2 == 1 {
		stacks[0], stacks[1] = stacks[1], stacks[0]
	}
	for _, stack := range stacks {
		r.logf("MTU %d: %s", mtu, stackName(stack, ""))
		r.sharedMode = stack == StackShared
		err := r.startDaemons(mtu, true, qpRoom(r.cfg.Connections)...)
		r.sharedMode = false
		if err != nil {
			return err
		}
		for _, m := range []func(){
			func() { r.siwtunBW(mtu, true, "write", 1<<20) },
			func() { r.siwtunLat(mtu, true, "write", 4) },
			func() { r.connRun(mtu, StackSiwtun, 1) },
		} {
			if err := r.ctx.Err(); err != nil {
				return err
			}
			n := len(r.res.Rows)
			m()
			for i := n; i < len(r.res.Rows); i++ {
				r.res.Rows[i].Stack = stack
			}
		}
		if err := r.stopDaemons(); err != nil {
			return err
		}
	}
	return nil
}

// daemonAddrArgs are the `siwtun up` flags that give daemon dev its
// address addr (host: the host side's on the TUN device): routed, or, in
// SuiteShared's shared runs, addr shared with the host on the TUN device.
func (r *runner) daemonAddrArgs(dev, addr, host string) []string {
	if r.sharedMode {
		return []string{"--shared", addr, "--shared-dev", dev}
	}
	return []string{"--addr", addr, "--host-addr", host}
}

// sharedTargets judges shared mode against routed mode at each MTU.
func (r *Results) sharedTargets() []Target {
	if !r.ran(SuiteShared) {
		return nil
	}
	var ts []Target
	on := boolp(true)
	for _, mtu := range r.mtus() {
		bw := Target{Name: "shared / routed: RDMA WRITE 1 MiB (CRC on)", MTU: mtu, Limit: TargetSharedBW, Unit: "x"}
		s, rt := r.find(mtu, StackShared, KindBW, "RDMA WRITE", 1<<20, on), r.find(mtu, StackRouted, KindBW, "RDMA WRITE", 1<<20, on)
		bw.Figure, bw.Missing = sharedRatio(s, rt)
		lat := Target{Name: "shared / routed: RDMA WRITE 4 B round trip (CRC on)", MTU: mtu, Limit: TargetSharedLat, Max: true, Unit: "x"}
		s, rt = r.find(mtu, StackShared, KindLat, "RDMA WRITE", 4, on), r.find(mtu, StackRouted, KindLat, "RDMA WRITE", 4, on)
		lat.Figure, lat.Missing = sharedRatio(s, rt)
		rate := Target{Name: "shared / routed: connections per second (one client)", MTU: mtu, Limit: TargetSharedRate, Unit: "x"}
		s, rt = r.findScale(mtu, StackShared, KindRate, TestConnect, 0, 1), r.findScale(mtu, StackRouted, KindRate, TestConnect, 0, 1)
		rate.Figure, rate.Missing = sharedRatio(s, rt)
		ts = append(ts, bw, lat, rate)
	}
	return ts
}

// sharedRatio is shared's value over routed's, or why there is none.
func sharedRatio(shared, routed *Row) (float64, string) {
	if shared == nil || routed == nil || routed.Value <= 0 {
		return 0, fmt.Sprintf("not measured in both modes (shared %v, routed %v)", shared != nil, routed != nil)
	}
	return shared.Value / routed.Value, ""
}
