// Package e2e holds Keel's end-to-end tests: real keel agent processes on
// the process driver, pulling from a real git repository served by git's
// own binaries, all on loopback (see localcluster); Linux only (the process
// driver and /proc), hence the build tag on every test file. TestFreeBSD*
// run the agents on the freebsd driver instead, each node a FreeBSD host
// simulated by fbsdsim's executables, and check the hosts' state. It has no code of its
// own outside its tests, and nothing may import it.
//
// The tests skip when git is not installed. The benchmarks are not part of
// go test's default run:
//
//	go test -run='^$' -bench=PushToConverged -benchtime=20x ./e2e
//	go test -run='^$' -bench=AgentIdle -benchtime=1x ./e2e
package e2e
