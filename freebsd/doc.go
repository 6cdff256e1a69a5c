// Package freebsd holds the files a FreeBSD host needs besides the keel
// binary: the rc.d script that runs the agent under daemon(8)
// (rc.d/keel, installed as /usr/local/etc/rc.d/keel), the syslog.d and
// newsyslog.conf.d examples for its log, and the tests that check them.
// It has no Go code to import; docs/install-freebsd.md says where each
// file goes. The driver that runs jails is nodeexec/freebsd.
package freebsd
