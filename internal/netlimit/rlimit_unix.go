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
	r := syscall.Rlimit{Cur: soft, Max: hard}
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
}
