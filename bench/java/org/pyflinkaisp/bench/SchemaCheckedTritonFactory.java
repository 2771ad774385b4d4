package org.pyflinkaisp.bench;

import java.io.ByteArrayOutputStream;
import java.io.Serializable;
import java.lang.reflect.Field;
import java.util.List;

import org.apache.flink.configuration.ReadableConfig;
import org.apache.flink.model.triton.TritonInferenceModelFunction;
import org.apache.flink.model.triton.TritonModelProviderFactory;
import org.apache.flink.model.triton.TritonTypeMapper;
import org.apache.flink.table.catalog.Column;
import org.apache.flink.table.catalog.ResolvedSchema;
import org.apache.flink.table.factories.FactoryUtil;
import org.apache.flink.table.ml.ModelProvider;
import org.apache.flink.table.types.logical.ArrayType;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.util.Preconditions;

/**
 * Flink's {@code triton} model provider (flink-model-triton 2.3.0, its only release) with the two
 * faults that stop it before any request repaired, so that bench/remote_bench.py can run Flink's
 * own ML_PREDICT against a V2 server: its single-column schema check fails every model, and its
 * function holds a non-serializable buffer, so the planner cannot ship it to a task. The requests
 * (one row each), the client, its retries and the response parsing are Flink's own, unchanged.
 * Provider identifier: {@code triton-schema-checked}; options as {@code triton}'s.
 */
public class SchemaCheckedTritonFactory extends TritonModelProviderFactory {
    public static final String IDENTIFIER = "triton-schema-checked";

    @Override
    public String factoryIdentifier() {
        return IDENTIFIER;
    }

    @Override
    public ModelProvider createModelProvider(Context context) {
        FactoryUtil.ModelProviderFactoryHelper helper =
                FactoryUtil.createModelProviderFactoryHelper(this, context);
        helper.validate();
        return new TritonModelProviderFactory.Provider(new Function(context, helper.getOptions()));
    }

    /** A ByteArrayOutputStream that serializes (empty: it is scratch space). */
    public static final class SerializableBuffer extends ByteArrayOutputStream implements Serializable {
        private static final long serialVersionUID = 1L;

        public SerializableBuffer() {
            super(1024);
        }
    }

    /** Flink's TritonInferenceModelFunction; only the input-schema check differs. */
    public static final class Function extends TritonInferenceModelFunction {
        private static final long serialVersionUID = 1L;

        public Function(Context context, ReadableConfig options) {
            super(context, options);
            try {
                // 2.3.0 keeps a ByteArrayOutputStream in a field of a Serializable function, so the
                // planner cannot ship it to a task: put a serializable one in its place
                Field buffer = TritonInferenceModelFunction.class.getDeclaredField("compressionBuffer");
                buffer.setAccessible(true);
                buffer.set(this, new SerializableBuffer());
            } catch (ReflectiveOperationException e) {
                throw new IllegalStateException("flink-model-triton changed: no compressionBuffer", e);
            }
        }

        /**
         * The check 2.3.0 meant: one physical column, of the expected type when one is given
         * (2.3.0 passes when the types differ and fails when they match or none is expected, so
         * it refuses every model), of a type Triton maps, not a nested array.
         */
        @Override
        protected void validateSingleColumnSchema(
                ResolvedSchema schema, LogicalType expected, String kind) {
            List<Column> columns = schema.getColumns();
            Preconditions.checkArgument(columns.size() == 1,
                    "Model should have exactly one %s column, but has %s", kind, columns.size());
            Column column = columns.get(0);
            LogicalType type = column.getDataType().getLogicalType();
            Preconditions.checkArgument(column.isPhysical(),
                    "%s column %s should be a physical column", kind, column.getName());
            Preconditions.checkArgument(expected == null || expected.equals(type),
                    "%s column %s should be %s, but is a %s", kind, column.getName(), expected, type);
            TritonTypeMapper.toTritonDataType(type);
            Preconditions.checkArgument(!(type instanceof ArrayType
                            && ((ArrayType) type).getElementType() instanceof ArrayType),
                    "%s column %s is a nested array: %s", kind, column.getName(), type);
        }
    }
}
