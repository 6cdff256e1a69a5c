//go:build unix && !freebsd

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
// on FreeBSD.
func setLimit[T int64 | uint64](field *T, v uint64) { *field = T(v) }
