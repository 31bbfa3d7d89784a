// Package logs writes container logs the way kubelet lays them out, in the CRI log format, from
// a logger process that containerd's shim owns, so that logging survives the agent's death.
//
// # Who writes
//
// A container's stdout and stderr are not piped through the agent. containerd's shim starts a
// logger binary for each task (containerd's "binary" log URI, see cio.BinaryIO), hands it the
// read ends of the container's stdout and stderr pipes as file descriptors 3 and 4 and a
// readiness pipe as 5, and stops it with SIGTERM when the task is deleted. The logger is the
// holdfast binary itself, reached through a symlink named [LoggerName] that [Install] makes
// under the agent's state directory: the shim runs the path of the log URI with the URI's query
// as arguments, as key value pairs in no particular order, and an environment holding only
// CONTAINER_ID and CONTAINER_NAMESPACE, so holdfast's main dispatches on the name it was run by
// (see [Main] and [ParseArgs]). The logger is a child of the shim, not of the agent: killing
// the agent, even with SIGKILL, loses no line.
//
// # Format
//
// One line per chunk of output, as kubelet and containerd's CRI plugin write it:
//
//	2026-11-02T10:04:05.123456789Z stdout F the message
//
// The timestamp is RFC 3339 in UTC with nine fixed fractional digits (it parses with
// time.RFC3339Nano, as kubelet parses it, and sorts as text). The tag is F for a full line (its
// newline, and a carriage return before it, removed) and P for a partial one: a line longer
// than the line limit (16 KiB by default, containerd's max_container_log_line_size) is cut into
// P chunks followed by an F chunk, and output that ends without a newline when the stream ends
// is written as P. Each line is one write(2) to a file opened with O_APPEND, so stdout and
// stderr lines never interleave within a line.
//
// # Layout and rotation
//
// PODLOGDIR/NAMESPACE_NAME_UID/CONTAINER/ATTEMPT.log, kubelet's layout. When writing a line
// would make the file larger than the maximum size, the file is fsynced, renamed to
// ATTEMPT.log.YYYYMMDD-HHMMSS (UTC, kubelet's rotation suffix; -001, -002 ... are added when
// several rotations fall in one second, so names still sort by age), a new ATTEMPT.log is
// created and the directory fsynced, then the oldest rotated files are removed so that at most
// the configured number of files (the live one included, as kubelet's containerLogMaxFiles
// counts) remain. Rotated files are not compressed.
//
// # Symlinks
//
// A container that can write into its own log directory (through a hostPath mount) must not be
// able to make holdfast write or read host files through a symlink (containerd
// GHSA-rgh6-rfwx-v388). The pod log root may be a symlink (an operator's choice, e.g. /var/log
// on a data partition), but the two directories below it (NAMESPACE_NAME_UID and CONTAINER) and
// the log file are opened one component at a time with O_NOFOLLOW: a symlink there is refused,
// never followed. Rotation renames and removes relative to the directory's open descriptor, so
// swapping a directory for a symlink after the logger started changes nothing either. A log
// file that is not a regular file or that has more than one hard link is refused too.
package logs
