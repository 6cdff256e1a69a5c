//go:build unix

package netlimit

import "syscall"

func getNofile() (soft, hard uint64, err error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, 0, err
	}
	return uint64(r.Cur), uint64(r.Max), nil
}

func setNofile(soft, hard uint64) error {
	var r syscall.Rlimit
	setLimit(&r.Cur, soft)
	setLimit(&r.Max, hard)
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
}

// setLimit stores v in a field of syscall.Rlimit: uint64 on Linux, int64
// on FreeBSD (rlim_t is __int64_t, RLIM_INFINITY its largest value), where
// a value past the int64 range is the largest one, not a negative one.
func setLimit[T int64 | uint64](field *T, v uint64) {
	t := T(v)
	if t < 0 {
		t = T(1<<63 - 1)
	}
	*field = t
}
