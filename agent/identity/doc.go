// Package identity owns the node's client identity towards the apiserver: the credentials in
// the state directory, the TLS bootstrap that obtains them, their rotation, and how close they
// are to expiring. Everything else asks it for a rest.Config and never reads the files itself.
//
// Two modes, as the kubelet has them:
//
//   - kubeconfig only: the file is the identity (a token, or certificate files the operator
//     renews); holdfast uses it as it is.
//   - bootstrapKubeconfig (a bootstrap token) and kubeconfig: holdfast generates a key, asks
//     for a certificate with a CertificateSigningRequest for the signer
//     kubernetes.io/kube-apiserver-client-kubelet (CN system:node:NAME, O system:nodes), keeps
//     key and certificate in <stateDir>/pki (0600, written to a new file then switched to by
//     a symlink, so a power cut leaves the old pair or the new one), writes kubeconfig
//     pointing at them, and renews the certificate at 70-90% of its lifetime, with jitter,
//     through client-go's certificate manager, using the certificate itself to authenticate
//     the renewal.
//
// What a gateway needs beyond the kubelet's behaviour:
//
//   - Offline, the current certificate is kept and used; renewal is retried until the
//     apiserver answers, and succeeds on reconnect.
//   - A clock that jumped backwards (no RTC battery: the gateway boots in 1970 or at the
//     image's build date until NTP answers) makes a valid certificate look "not yet valid".
//     It is kept and used all the same: only the apiserver's clock judges it, and bootstrapping
//     again would need a token that may be long gone. Nothing here ever deletes a certificate.
//   - Expiry is visible: an Event when a certificate is issued or renewed, a node condition
//     (HoldfastClientCertificateExpiring) once renewal is overdue, and a warning Event then.
package identity
