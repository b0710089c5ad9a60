package ibv

// MTUEnum converts a link MTU in bytes to the verbs MTU enum (enum ibv_mtu:
// 1..5 for 256..4096 bytes) as the kernel's ib_mtu_int_to_enum does: the
// largest enum not above the MTU, at least 256 (1).
func MTUEnum(mtu int) int {
	switch {
	case mtu >= 4096:
		return 5
	case mtu >= 2048:
		return 4
	case mtu >= 1024:
		return 3
	case mtu >= 512:
		return 2
	}
	return 1
}

// MTUEnumBytes is the size in bytes of a verbs MTU enum (1 → 256).
func MTUEnumBytes(e int) int { return 128 << e }
