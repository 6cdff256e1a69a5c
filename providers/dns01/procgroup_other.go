//go:build !unix

package dns01

import "os/exec"

// ownProcessGroup leaves cmd as it is: only the program itself is killed
// on cancellation.
func ownProcessGroup(cmd *exec.Cmd) {}
