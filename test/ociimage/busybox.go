package ociimage

import "io/fs"

// BusyboxApplets are the applets BusyboxLayer links to /bin/busybox: enough for shells,
// sleepers, small servers and clients, and the probes and checks tests write in sh.
var BusyboxApplets = []string{
	"[", "[[", "ash", "awk", "basename", "cat", "chmod", "chown", "cp", "cut", "date", "dd",
	"df", "dirname", "du", "echo", "env", "expr", "false", "find", "free", "grep", "gunzip",
	"gzip", "head", "hostname", "httpd", "id", "ifconfig", "ip", "kill", "killall", "ln", "ls",
	"md5sum", "mkdir", "mkfifo", "mktemp", "mount", "mv", "nc", "netstat", "nslookup", "ping",
	"printf", "ps", "pwd", "readlink", "rm", "rmdir", "route", "sed", "seq", "sh",
	"sha256sum", "sleep", "sort", "stat", "sync", "tail", "tar", "tee", "test", "timeout", "top",
	"touch", "tr", "true", "umount", "uname", "uniq", "uptime", "usleep", "vi", "watch", "wc",
	"wget", "whoami", "xargs", "yes",
}

// BusyboxLayer returns the entries of a minimal root file system built around a static busybox
// binary: /bin/busybox, a symlink per applet in BusyboxApplets, /usr/bin/env for scripts that
// use it, /etc/passwd and /etc/group with root and nobody, and a sticky /tmp.
func BusyboxLayer(busybox []byte) []Entry {
	entries := []Entry{
		File("bin/busybox", 0o755, busybox),
		Dir("etc", 0o755),
		File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"+
			"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")),
		File("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")),
		Dir("root", 0o700),
		Dir("tmp", fs.ModeSticky|0o777),
		Dir("usr/bin", 0o755),
		Symlink("usr/bin/env", "../../bin/busybox"),
		Dir("var", 0o755),
	}
	for _, applet := range BusyboxApplets {
		entries = append(entries, Symlink("bin/"+applet, "busybox"))
	}
	return entries
}
