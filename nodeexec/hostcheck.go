package nodeexec

import (
	"context"
	"errors"
)

// HostChecker is implemented by drivers that can tell what on the host
// keeps them from working (the freebsd driver: parent datasets, IP
// forwarding, resource accounting, VNET, pf). The agent calls Check at
// start and then periodically, from a goroutine of its own, concurrently
// with the other methods of the driver: implementations are safe for
// concurrent use. Check changes nothing on the host; it may take seconds
// (it runs commands). An error means the checks could not run at all, and
// says nothing about the problems: the caller keeps what it last knew.
type HostChecker interface {
	Check(ctx context.Context) ([]HostProblem, error)
}

// HostProblem is a host prerequisite that does not hold, with how to fix
// it. Check names what was checked, one of report.Checks ("datasets",
// "forwarding", "racct", "vnet", "pf"): a problem of another name is
// logged but left out of the node's report.
type HostProblem struct {
	Check   string
	Problem string
	Fix     string
}

func (p HostProblem) String() string { return p.Check + ": " + p.Problem + "; fix: " + p.Fix }

// ErrLimitsUnenforced is wrapped by Start and Apply when an instance asks
// for resource limits that the node cannot enforce (the freebsd driver's
// ErrRacctDisabled): the instance is refused, never run unlimited. Every
// instance has limits (render gives resources defaults), so on such a node
// none starts; and none that runs meets the refusal in Apply, since it
// started while the node could enforce limits, and on FreeBSD that only
// changes with a reboot, which ends every jail.
var ErrLimitsUnenforced = errors.New("resource limits cannot be enforced on this node")
