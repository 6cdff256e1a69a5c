// Package proctest tells the tests whether a process has ended, from
// Linux's /proc.
package proctest

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// Gone reports whether pid has ended: it is gone, or a zombie waiting for
// its parent (init reaps an orphan when it likes).
func Gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name, which may hold
	// anything, ')' and spaces included.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// WaitGone waits up to d for pid to end (Gone), and reports whether it did.
func WaitGone(pid int, d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if Gone(pid) {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}
