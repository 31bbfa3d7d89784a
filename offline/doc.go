// Package offline is holdfast's state store: what the agent must remember to
// keep running pods while the apiserver is unreachable, to boot them with no
// apiserver, and to reconcile when it returns.
//
// The agent uses the Store interface. BoltStore (Open) is one bbolt file
// under the agent's state directory; MemStore is the same semantics in
// memory for unit tests of agent logic. One contract suite runs against both.
//
// # Guarantees
//
//   - Durability: every write is a bbolt transaction committed with fsync
//     (NoSync is never set), or for a pod status (AppendStatus) a record
//     appended to the status journal and fdatasynced. A method that returned
//     nil survived; a kill -9 at any point loses at most the writes whose
//     calls had not returned; a power cut may also lose the acks of delivered
//     statuses, which are written but not synced (a status lost so is sent
//     once more).
//   - Flash wear per status change: one journal append and one fdatasync (a
//     bbolt commit costs two syncs and several pages). Pod records are kept
//     without their status, so the apiserver's echo of a status rewrites
//     nothing; GetPod and LoadPods give the record the outbox's latest status.
//   - Flash wear: a put whose encoded value is byte-identical to the stored
//     one writes nothing (Stats.SkippedWrites); the check runs in a read
//     transaction, so an unchanged write costs no fsync at all.
//   - Concurrent writes are group-committed: writers that arrive while a
//     commit is in flight share the next transaction (Stats.Commits).
//   - One agent per file: Open holds an exclusive flock on "<path>.lock"
//     and waits at most Options.Timeout (1 s) for it; a second agent gets an
//     error wrapping ErrLocked that names the path and the holder's PID.
//   - A bad file never stops a boot: Open moves an unusable file aside to
//     "<path>.corrupt-<UTC timestamp>", starts empty, and says so in its
//     OpenReport (for an event and a node condition). The agent then
//     rebuilds from containerd's labels, static manifests and the apiserver.
//   - A bad record never fails a load: it is moved to the quarantine bucket
//     with its key, and reported in the per-key error map of LoadPods or
//     PendingStatuses (or as ErrCorruptRecord by a single Get); the good
//     records are returned. Every value carries a CRC-32C so bit rot is
//     caught here rather than acted upon.
//   - Empty means unknown: nothing in this package turns "no record" into
//     "delete".
//
// # Files
//
// For a database at <path> (the agent's choice, e.g. <state-dir>/state.db):
//
//	<path>                      the bbolt file, mode 0600, directory 0700
//	<path>.lock                 flock target holding the owner's PID; never removed
//	<path>.new                  a fresh database being created (renamed into place)
//	<path>.corrupt-<timestamp>  an unusable file moved aside, kept for inspection
//
// # Encryption at rest
//
// Secrets and service account tokens are sealed with the state key (Options.Key,
// read by LoadKey from the file the firmware provisions), and so are pod records
// (a pod's inline env values, and kubectl's last-applied annotation that repeats
// them, are as secret as Secrets) and, with Options.SealConfigMaps, ConfigMaps:
// AES-GCM under a key
// derived from it with HKDF-SHA256, bound to the record's bucket path and key
// as additional data. The nonce is an HMAC of place and plaintext under a
// second derived key, so the same value seals to the same bytes (an unchanged
// put writes nothing) and two values never share a nonce. A sealed value is
// framed like any other; its JSON is {keyID, nonce, data}, keyID naming the key
// (a derived hash, never the key). Read with another key or none, it is
// ErrKeyMismatch: treated as missing and left in place (a pod record too: the
// pod waits for the apiserver, which gives it again, and the record is written
// anew). Without a key, PutSecret and PutToken return ErrNoKey, and pod records
// and ConfigMaps are framed in the clear; read with a key, such a record is
// taken as it is, and Open seals every one it finds (OpenReport.Sealed), so none
// stays in the clear once a key is configured. Their old bytes may stay in the
// file's free pages until bbolt reuses them: provision the key before the first
// boot (firmware/install.sh does).
//
// # Schema v4 (current)
//
// Raw values are marked (raw); sealed values (sealed) are encrypted as above;
// every other value is framed as CRC-32C (4 bytes, big-endian) followed by
// JSON.
//
//	meta/
//	|-- version                  -> "4" (raw ASCII decimal)
//	|-- node_name                -> node name (raw); legacy, see below
//	|-- boot_count               -> uint64, 8 bytes big-endian (raw); created as 0; legacy
//	|-- sealed_by                -> ID of the key pod records are sealed with (raw); absent
//	                                while the database never had a key (then pod records are
//	                                in the clear; once set, a pod record in the clear is refused
//	                                and none is written without that key: ErrNoKey)
//	pods/
//	|-- <pod UID>/
//	    |-- pod                  -> {"source": "api"|"file", "pod": v1.Pod as applied}
//	                                (sealed when there is a key)
//	    |-- admission            -> Admission {accepted, at, reason, message}; absent until decided
//	    |-- containers/             legacy, see below
//	        |-- <container name> -> container record {name, containerID, attempt,
//	                                restartCount, lastTermination {exitCode, signal,
//	                                reason, message, startedAt, finishedAt, containerID}}
//	    |-- tokens/
//	        |-- <name>           -> Token {token, issuedAt, expiresAt} (sealed); the name
//	                                is the caller's, one per projection
//	    |-- allocation/             (added in v4 without a version bump: older agents
//	                                never read it, and it goes with its pod)
//	        |-- containers       -> Allocation {containers: {<container name>:
//	                                v1.ResourceRequirements}, pod: v1.ResourceRequirements}:
//	                                the resources the node allocated to the pod's
//	                                containers and to the pod (in-place resize); pod was
//	                                added later, without a version bump: absent, none
//	sync/                           legacy, see below
//	|-- pods_resource_version    -> string: RV of the last complete pod list/watch event
//	configmaps/
//	|-- <namespace>/<name>       -> v1.ConfigMap (its RV in metadata); sealed with SealConfigMaps
//	secrets/
//	|-- <namespace>/<name>       -> v1.Secret (sealed; its RV in metadata)
//	node/                           legacy, see below
//	|-- node                     -> v1.Node
//	outbox/, outbox_index/          empty: agents before the status journal kept the outbox
//	                                here; Open moves what it finds into the journal (and the
//	                                bucket's sequence number), then empties them. A rolled-back
//	                                agent finds them empty: undelivered statuses are computed
//	                                again from what runs.
//	quarantine/                     (bucket sequence = last quarantine number)
//	|-- <n, uint64 big-endian>   -> {key: original bucket path and key, reason, at, value: raw bytes}
//	policy_modules/                 (created by the first module put; v3 agents ignored it)
//	|-- <sha256:hex>             -> crc32c (4 bytes, big-endian) || Wasm module bytes (not JSON:
//	                                a module may be 64 MiB); the key is the OCI manifest digest
//	                                policies.yaml pins
//
// The legacy parts, meta/node_name, meta/boot_count, sync/, node/ and a pod's containers/,
// held a node name, a boot counter, the last pod list's resourceVersion, the Node object and
// one record per container. Earlier versions of this package had methods to write and read
// them (the v1 prototype wrote the node name and the Node); the agent never used them, and
// records what runs on containerd's labels instead. This version neither writes nor reads
// them, but keeps the tree they live in, so that an older agent started again after a firmware
// rollback finds what it expects: Open and the migrations still create sync/, node/ and
// meta/boot_count (0), and v1 pods get an empty containers/ bucket. A file that holds them
// (a v1 or v2 file, or one written through those methods) opens and loads as any other: a
// pod's containers/ bucket, whatever it holds (undecodable records too), is not read, never
// quarantined, and is deleted with its pod. Their shapes drawn above stay part of the schema
// while an older agent may read them.
//
// The status journal, "<path>.outbox.a" and "<path>.outbox.b" beside the database
// (journal.go): two files taking turns, each of frames of a 4-byte length and a
// CRC-32C-checked JSON record, appended: a status {gen, seq, uid, namespace, name, status,
// timestamp}, an ack {gen, uid, upTo}, a forget {gen, uid}; a compaction writes, at the start
// of the file that is not current, one record {gen+1, seq, pods: every pod's entry} and makes
// it current. At Open the file of the higher generation is current; records of a lower
// generation than their file's are not read; a torn or damaged frame of the current file (or
// at the start of the other) is skipped and quarantined (outbox/journal.a@<offset>,
// outbox/journal.b@<offset>). "<path>.outbox" is the one file of an agent before two
// (compacted into per-pod snapshot records and a seq record, by a rename): found at Open, its
// statuses are taken over as the newest, numbered above every number handed out, and it is
// removed by the compaction that makes them durable in the two files.
//
// # Schema v3 (previous)
//
// As v4 without meta/sealed_by, and with pod records and ConfigMaps always in
// the clear. Open migrates v3 to v4 by its version alone; the first open with a
// key then seals the pod records (OpenReport.Sealed). A v3 agent would take a
// sealed pod record for a corrupt one: the version makes it move the database
// aside instead, after a firmware rollback.
//
// # Schema v2 (older)
//
// As v3 without tokens/ buckets, and with Secrets framed in the clear.
// offline/testdata/schema-v2.db is one, produced by offline/internal/genv2db.
// Open migrates v2 to v3 in one transaction: with a key every Secret is
// sealed, without one Secrets are dropped (the apiserver gives them again);
// nothing else changes. The pages that held them are freed by bbolt, not
// zeroed: their bytes stay in the file until bbolt reuses the pages.
//
// # Schema v1 (older)
//
// Written by the first prototype; offline/testdata/schema-v1.db is one,
// produced by offline/internal/genv1db. Plain JSON values, no checksum; pods
// keyed by namespace/name and written only once admitted; no container
// records, outbox, boot counter, sync or quarantine buckets.
//
//	meta/
//	|-- version            -> "1" (raw)
//	|-- node_name          -> node name (raw)
//	pods/
//	|-- <namespace>/<name> -> {"source", "pod": v1.Pod, "admittedAt"}
//	configmaps/
//	|-- <namespace>/<name> -> v1.ConfigMap
//	secrets/
//	|-- <namespace>/<name> -> v1.Secret
//	node/
//	|-- node               -> v1.Node
//
// Open migrates v1 to v2 (then v2 to v3) in one transaction: pods are re-keyed by UID with an
// accepted admission at admittedAt and no container records, every value is
// framed with its checksum, the new buckets are created. A v1 record that
// does not decode, or a pod without a UID, is quarantined under its v1 key.
//
// Changing the JSON shape of a record type (Admission, Token, the entries in
// codec.go, and the legacy container records an older agent may still read)
// means a new schema version and a migration, with a test against a file of
// the previous version.
package offline
