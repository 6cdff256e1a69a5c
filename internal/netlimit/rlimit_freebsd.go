package netlimit

import "syscall"

// FreeBSD's Rlimit fields are int64 (sys/sys/resource.h: rlim_t is
// __int64_t); RLIM_INFINITY is the largest value, as on Linux.
func getNofile() (soft, hard uint64, err error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, 0, err
	}
	return uint64(r.Cur), uint64(r.Max), nil
}

func setNofile(soft, hard uint64) error {
	r := syscall.Rlimit{Cur: int64(min(soft, 1<<63-1)), Max: int64(min(hard, 1<<63-1))}
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
}
