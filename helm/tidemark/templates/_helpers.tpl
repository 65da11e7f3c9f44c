{{/* Names: <release>-tidemark unless the release name already contains the chart's name. */}}
{{- define "tidemark.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tidemark.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "driver"). */}}
{{- define "tidemark.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidemark.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tidemark.labels" -}}
{{ include "tidemark.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version }}
{{- end -}}

{{- define "tidemark.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "tidemark.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (printf "%s-driver" (include "tidemark.fullname" .)) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "tidemark.zookeeper.name" -}}
{{- printf "%s-zookeeper" (include "tidemark.fullname" .) -}}
{{- end -}}

{{/* The connect string with the chroot: the bundled servers one by one, or the external ensemble. */}}
{{- define "tidemark.zookeeper.connect" -}}
{{- $zk := .Values.zookeeper -}}
{{- if $zk.bundled.enabled -}}
{{- $name := include "tidemark.zookeeper.name" . -}}
{{- $servers := list -}}
{{- range $i := until (int $zk.bundled.replicas) -}}
{{- $servers = append $servers (printf "%s-%d.%s-headless.%s.svc:2181" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- printf "%s%s" (join "," $servers) $zk.chroot -}}
{{- else -}}
{{- printf "%s%s" $zk.external.connect $zk.chroot -}}
{{- end -}}
{{- end -}}

{{/* Cross-value rules the schema cannot word clearly: each fails the install with a sentence. */}}
{{- define "tidemark.validate" -}}
{{- $zk := .Values.zookeeper -}}
{{- if and $zk.bundled.enabled $zk.external.connect -}}
{{- fail "zookeeper: both zookeeper.bundled.enabled and zookeeper.external.connect are set; disable the bundled ensemble to use an external one, or clear external.connect" -}}
{{- end -}}
{{- if not (or $zk.bundled.enabled $zk.external.connect) -}}
{{- fail "zookeeper: no ensemble; set zookeeper.external.connect (host:port,...) or zookeeper.bundled.enabled=true" -}}
{{- end -}}
{{- if and $zk.tls.enabled $zk.bundled.enabled -}}
{{- fail "zookeeper.tls: TLS is supported towards an external ensemble only; the bundled one serves plaintext inside the namespace" -}}
{{- end -}}
{{- if and $zk.tls.enabled (not $zk.tls.existingSecret) -}}
{{- fail "zookeeper.tls.existingSecret: name the Secret that holds the CA (and client certificate) when zookeeper.tls.enabled=true" -}}
{{- end -}}
{{- if and (include "tidemark.zookeeper.requireAuth" .) .Values.exporter.enabled (not $zk.auth.readerSecret) -}}
{{- fail "zookeeper.bundled.requireAuth: the bundled servers refuse clients without an identity, and the exporter has none; set zookeeper.auth.readerSecret, or requireAuth=false" -}}
{{- end -}}
{{- if and $zk.auth.operatorSecret (not $zk.auth.existingSecret) -}}
{{- fail "zookeeper.auth.operatorSecret: the operator identity comes with the writer identity; set zookeeper.auth.existingSecret too" -}}
{{- end -}}
{{- if and $zk.bundled.enabled (eq (int $zk.bundled.replicas) 2) -}}
{{- fail "zookeeper.bundled.replicas: 2 servers tolerate no failure, like 1; use 1 for a test or 3 or 5 for production" -}}
{{- end -}}
{{- $s3 := .Values.catalog.s3 -}}
{{- /* A PostgreSQL catalog's warehouse is a location; a REST catalog's may be a name its server knows. */}}
{{- $sqlCatalog := or .Values.catalog.bundledPostgres.enabled (hasPrefix "postgres" .Values.catalog.uri.value) -}}
{{- if and $s3.enabled (not (regexMatch "^s3a?://" .Values.catalog.warehouse)) (or $sqlCatalog (regexMatch "^[a-z0-9+.-]+://" .Values.catalog.warehouse)) -}}
{{- fail (printf "catalog.warehouse: %q is not an s3:// location while catalog.s3.enabled=true; use s3://bucket/path (or a REST catalog's warehouse name) or disable catalog.s3" .Values.catalog.warehouse) -}}
{{- end -}}
{{- $credential := .Values.catalog.rest.credential -}}
{{- if and $credential.value $credential.existingSecret -}}
{{- fail "catalog.rest.credential: give value (the chart creates the Secret) or existingSecret (a Secret you created), not both" -}}
{{- end -}}
{{- $jobNames := dict -}}
{{- range $name, $values := .Values.jobs -}}
{{- if not (regexMatch "^[a-z]([-_a-z0-9]{0,18}[a-z0-9])?$" $name) -}}
{{- fail (printf "jobs.%s: a job's key names its Kubernetes objects (%s-<key>), so it must be lower-case letters, digits, '-' or '_' (an '_' becomes '-'), start with a letter, end with a letter or digit and have at most 20 characters; the Tidemark job name is the one your script gives EpochJob, whatever the key" $name (include "tidemark.fullname" $)) -}}
{{- end -}}
{{- $dns := include "tidemark.jobName" $name -}}
{{- with get $jobNames $dns -}}
{{- fail (printf "jobs.%s and jobs.%s would both name their objects %s-%s (an '_' becomes '-'): rename one" . $name (include "tidemark.fullname" $) $dns) -}}
{{- end -}}
{{- $_ := set $jobNames $dns $name -}}
{{- $job := include "tidemark.job" (dict "ctx" $ "values" $values) | fromYaml -}}
{{- $scaling := $job.executor.dynamicAllocation -}}
{{- if and $scaling.enabled (lt (int $scaling.maxExecutors) (int $scaling.minExecutors)) -}}
{{- fail (printf "jobs.%s: executor.dynamicAllocation.maxExecutors (%v) is below minExecutors (%v)" $name $scaling.maxExecutors $scaling.minExecutors) -}}
{{- end -}}
{{- if and $job.zkAuthSecret (not (and $zk.auth.existingSecret $zk.auth.operatorSecret)) -}}
{{- fail (printf "jobs.%s.zkAuthSecret: a job with its own identity needs zookeeper.auth.existingSecret (the writer) and zookeeper.auth.operatorSecret (who may fence and unregister it)" $name) -}}
{{- end -}}
{{- if and $job.script $job.scriptPath -}}
{{- fail (printf "jobs.%s: set either script (inline) or scriptPath (a file in the image), not both" $name) -}}
{{- end -}}
{{- if not (or $job.script $job.scriptPath) -}}
{{- fail (printf "jobs.%s: no driver script; set script (inline Python) or scriptPath (a file in the image)" $name) -}}
{{- end -}}
{{- end -}}
{{- $uri := .Values.catalog.uri -}}
{{- $catalogs := 0 -}}
{{- range $way := list $uri.value $uri.existingSecret .Values.catalog.bundledPostgres.enabled -}}
{{- if $way }}{{ $catalogs = add1 $catalogs }}{{ end -}}
{{- end -}}
{{- if gt (int $catalogs) 1 -}}
{{- fail "catalog: give the catalog one way only: catalog.uri.value (the chart creates the Secret), catalog.uri.existingSecret (a Secret you created) or catalog.bundledPostgres.enabled (the chart runs PostgreSQL)" -}}
{{- end -}}
{{- if eq (int $catalogs) 0 -}}
{{- fail (printf "catalog.uri: the drivers and GC need the catalog's URI; set catalog.uri.value (postgresql://user:password@host:5432/catalog, or a REST catalog's https://...: the chart keeps it in the Secret %s-catalog), catalog.uri.existingSecret (a Secret you created, its key catalog.uri.key=%s holding the URI) or catalog.bundledPostgres.enabled=true (the chart runs a small PostgreSQL); helm/tidemark/examples/ has complete values" (include "tidemark.fullname" .) $uri.key) -}}
{{- end -}}
{{- if $s3.enabled -}}
{{- $credentials := $s3.credentials -}}
{{- $pair := or $credentials.accessKeyId $credentials.secretAccessKey -}}
{{- if and $pair (not (and $credentials.accessKeyId $credentials.secretAccessKey)) -}}
{{- fail "catalog.s3.credentials: set both accessKeyId and secretAccessKey, or neither" -}}
{{- end -}}
{{- $ways := 0 -}}
{{- range $way := list $pair $credentials.existingSecret $credentials.podIdentity -}}
{{- if $way }}{{ $ways = add1 $ways }}{{ end -}}
{{- end -}}
{{- if ne (int $ways) 1 -}}
{{- fail (printf "catalog.s3.credentials: the drivers, their executors and GC need S3 credentials in exactly one way (%d given): accessKeyId and secretAccessKey (the chart keeps them in the Secret %s-s3), existingSecret (a Secret you created, keys accessKeyIdKey and secretAccessKeyKey), or podIdentity: true (IRSA, an instance role); or set catalog.s3.enabled=false for another file system" (int $ways) (include "tidemark.fullname" .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* One job's settings: its values over jobDefaults, and its executor over spark.executor.
     A job's value replaces the default even when it is false or 0, which Helm's merge skips. */}}
{{- define "tidemark.job" -}}
{{- $job := deepCopy .ctx.Values.jobDefaults -}}
{{- range $key, $value := .values -}}
{{- $_ := set $job $key $value -}}
{{- end -}}
{{- $executor := deepCopy .ctx.Values.spark.executor -}}
{{- range $key, $value := (.values.executor | default dict) -}}
{{- if eq $key "dynamicAllocation" -}}
{{- $scaling := deepCopy $executor.dynamicAllocation -}}
{{- range $setting, $chosen := $value -}}
{{- $_ := set $scaling $setting $chosen -}}
{{- end -}}
{{- $_ := set $executor $key $scaling -}}
{{- else -}}
{{- $_ := set $executor $key $value -}}
{{- end -}}
{{- end -}}
{{- $_ := set $job "executor" $executor -}}
{{- toYaml $job -}}
{{- end -}}

{{/* Environment of every process that talks to ZooKeeper: the connect string, TLS and the
     digest identities. Drivers (role "writer") authenticate as the writer and grant the reader
     identity read access, and with a jobSecret as the job's own identity too (they learn the
     operator's name); GC and the init hook (role "operator") also authenticate as the operator;
     the exporter (role "reader") has the reader identity only. */}}
{{- define "tidemark.zookeeper.env" -}}
{{- $zk := .ctx.Values.zookeeper -}}
- name: TIDEMARK_ZK
  value: {{ include "tidemark.zookeeper.connect" .ctx | quote }}
{{- if has .role (list "writer" "operator") }}
{{- with $zk.auth.existingSecret }}
- name: TIDEMARK_ZK_USER
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: {{ $zk.auth.userKey | quote }}}
- name: TIDEMARK_ZK_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: {{ $zk.auth.passwordKey | quote }}}
{{- end }}
{{- with $zk.auth.operatorSecret }}
- name: TIDEMARK_ZK_OPERATOR_USER
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: {{ $zk.auth.operatorUserKey | quote }}}
{{- if eq $.role "operator" }}
- name: TIDEMARK_ZK_OPERATOR_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: {{ $zk.auth.operatorPasswordKey | quote }}}
{{- end }}
{{- end }}
{{- with .jobSecret }}
- name: TIDEMARK_ZK_JOB_USER
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: user}
- name: TIDEMARK_ZK_JOB_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: password}
{{- end }}
{{- end }}
{{- with $zk.auth.readerSecret }}
- name: TIDEMARK_ZK_READER_USER
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: {{ $zk.auth.readerUserKey | quote }}}
- name: TIDEMARK_ZK_READER_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: {{ $zk.auth.readerPasswordKey | quote }}}
{{- end }}
{{- if $zk.tls.enabled }}
- name: TIDEMARK_ZK_TLS
  value: "1"
- name: TIDEMARK_ZK_TLS_CA
  value: /etc/tidemark/zookeeper-tls/ca.crt
{{- if $zk.tls.certKey }}
- name: TIDEMARK_ZK_TLS_CERT
  value: /etc/tidemark/zookeeper-tls/tls.crt
- name: TIDEMARK_ZK_TLS_KEY
  value: /etc/tidemark/zookeeper-tls/tls.key
{{- end }}
- name: TIDEMARK_ZK_TLS_CHECK_HOSTNAME
  value: {{ ternary "1" "0" $zk.tls.checkHostname | quote }}
{{- end }}
{{- end -}}

{{/* Environment of every process that opens the Iceberg catalog from Python (drivers, GC): the
     catalog, and the S3 settings pyiceberg reads from PYICEBERG_CATALOG__<NAME>__*. */}}
{{/* The Secret holding the catalog URI: the one named in values, the bundled PostgreSQL's, or the one
     the chart creates from catalog.uri.value. */}}
{{- define "tidemark.catalog.secret" -}}
{{- if .Values.catalog.bundledPostgres.enabled -}}
{{- include "tidemark.postgres.name" . -}}
{{- else -}}
{{- .Values.catalog.uri.existingSecret | default (printf "%s-catalog" (include "tidemark.fullname" .)) -}}
{{- end -}}
{{- end -}}

{{- define "tidemark.postgres.name" -}}
{{- printf "%s-postgres" (include "tidemark.fullname" .) -}}
{{- end -}}

{{/* The Secret holding the S3 key pair: the one named in values, the one the chart creates, or
     nothing (the pods' own identity). */}}
{{- define "tidemark.s3.secret" -}}
{{- $credentials := .Values.catalog.s3.credentials -}}
{{- if $credentials.existingSecret -}}
{{- $credentials.existingSecret -}}
{{- else if $credentials.accessKeyId -}}
{{- printf "%s-s3" (include "tidemark.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding a REST catalog's OAuth2 client credentials: the one named in values, the one the
     chart creates, or nothing (a catalog without them). */}}
{{- define "tidemark.rest.secret" -}}
{{- $credential := .Values.catalog.rest.credential -}}
{{- if $credential.existingSecret -}}
{{- $credential.existingSecret -}}
{{- else if $credential.value -}}
{{- printf "%s-rest" (include "tidemark.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* A job's key as a DNS label: word_counts -> word-counts (the key rule is checked in tidemark.validate). */}}
{{- define "tidemark.jobName" -}}
{{- . | replace "_" "-" -}}
{{- end -}}

{{- define "tidemark.catalog.env" -}}
{{- $catalog := .Values.catalog -}}
{{- $s3 := $catalog.s3 -}}
- name: TIDEMARK_CATALOG_NAME
  value: {{ $catalog.name | quote }}
- name: TIDEMARK_CATALOG_URI
  valueFrom:
    secretKeyRef: {name: {{ include "tidemark.catalog.secret" . | quote }}, key: {{ $catalog.uri.key | quote }}}
- name: TIDEMARK_WAREHOUSE
  value: {{ $catalog.warehouse | quote }}
{{- /* A REST catalog's settings, as pyiceberg reads them (PYICEBERG_CATALOG__<NAME>__*): Tidemark takes the
       rest of a catalog's settings from there, and derives the Spark session's from them. */}}
{{- $rest := printf "PYICEBERG_CATALOG__%s__" (upper $catalog.name) }}
{{- with include "tidemark.rest.secret" . }}
- name: {{ $rest }}CREDENTIAL
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: {{ $catalog.rest.credential.key | quote }}}
{{- end }}
{{- with $catalog.rest.oauth2ServerUri }}
- name: {{ $rest }}OAUTH2_SERVER_URI
  value: {{ . | quote }}
{{- end }}
{{- with $catalog.rest.scope }}
- name: {{ $rest }}SCOPE
  value: {{ . | quote }}
{{- end }}
{{- if $s3.enabled }}
- name: AWS_REGION
  value: {{ $s3.region | quote }}
{{- with include "tidemark.s3.secret" . }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: {{ $s3.credentials.accessKeyIdKey | quote }}}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: {{ $s3.credentials.secretAccessKeyKey | quote }}}
{{- end }}
{{- /* pyiceberg (the Python side of every commit) reads the same S3 settings from
       PYICEBERG_CATALOG__<NAME>__*. */}}
{{- $pyiceberg := printf "PYICEBERG_CATALOG__%s__S3__" (upper $catalog.name) }}
- name: {{ $pyiceberg }}REGION
  value: {{ $s3.region | quote }}
{{- with $s3.endpoint }}
- name: {{ $pyiceberg }}ENDPOINT
  value: {{ . | quote }}
{{- end }}
- name: {{ $pyiceberg }}FORCE_VIRTUAL_ADDRESSING
  value: {{ not $s3.pathStyleAccess | toString | quote }}
{{- end }}
{{- end -}}

{{- define "tidemark.zookeeper.tlsVolumeMount" -}}
{{- if .Values.zookeeper.tls.enabled -}}
- name: zookeeper-tls
  mountPath: /etc/tidemark/zookeeper-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "tidemark.zookeeper.tlsVolume" -}}
{{- $tls := .Values.zookeeper.tls -}}
{{- if $tls.enabled -}}
- name: zookeeper-tls
  secret:
    secretName: {{ $tls.existingSecret | quote }}
    defaultMode: 0440
    items:
      - {key: {{ $tls.caKey | quote }}, path: ca.crt}
      {{- if $tls.certKey }}
      - {key: {{ $tls.certKey | quote }}, path: tls.crt}
      - {key: {{ $tls.keyKey | quote }}, path: tls.key}
      {{- end }}
{{- end }}
{{- end -}}

{{/* Pod anti-affinity that spreads the pods matching `labels` over nodes: soft or hard. */}}
{{- define "tidemark.antiAffinity" -}}
{{- $term := dict "labelSelector" (dict "matchLabels" .labels) "topologyKey" "kubernetes.io/hostname" -}}
podAntiAffinity:
{{- if eq .mode "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    {{- list $term | toYaml | nindent 4 }}
{{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        {{- $term | toYaml | nindent 8 }}
{{- end }}
{{- end -}}


{{/* "true" when the bundled servers refuse clients that send no identity (enforce.auth): they are
     bundled, requireAuth is on and a writer identity is configured; else empty. */}}
{{- define "tidemark.zookeeper.requireAuth" -}}
{{- $zk := .Values.zookeeper -}}
{{- if and $zk.bundled.enabled $zk.bundled.requireAuth $zk.auth.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* True when some job has its own ZooKeeper identity: a `tidemark init` hook then gives the tree the
     operator identity before the drivers need it. */}}
{{- define "tidemark.perJobIdentities" -}}
{{- range $name, $job := .Values.jobs -}}{{- if $job.zkAuthSecret -}}true{{- end -}}{{- end -}}
{{- end -}}
