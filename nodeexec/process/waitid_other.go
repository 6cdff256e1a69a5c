//go:build !linux

package process

import "errors"

// waitExited is only implemented on Linux, the one system this driver
// supports; elsewhere the reaper skips killing a group's leftovers.
func waitExited(pid int) error { return errors.ErrUnsupported }
