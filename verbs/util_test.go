package verbs_test

import (
	"errors"
	"net/netip"
)

func netipPort(p uint16) netip.AddrPort { return netip.AddrPortFrom(srvAddr.Addr(), p) }

func asErr[T error](err error, target *T) bool { return errors.As(err, target) }
